"""The standard ``OTEL_*`` environment variables, as ``tracing:`` config values (pure).

:func:`proxy.config.settings.load_config` reads the environment (only there) and hands it to
:func:`tracing_values`; what it returns is the base the file's ``tracing:`` section is laid over
(a key in the file wins over the variable). Only what the proxy's exporter can do is accepted:
OTLP over HTTP with protobuf; any other exporter or protocol is a start-up error, not a silent
"no traces". Durations follow the OpenTelemetry specification (milliseconds), not the Python
exporter's reading of ``OTEL_EXPORTER_OTLP_TIMEOUT`` as seconds.

| variable | ``tracing.`` key |
|---|---|
| ``OTEL_SDK_DISABLED=true`` | ``enabled: false``, even over the file's ``true`` |
| ``OTEL_TRACES_EXPORTER=none`` | ``enabled: false`` |
| ``OTEL_TRACES_EXPORTER=otlp``; ``OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT`` set | ``enabled: true`` |
| ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (as is), ``OTEL_EXPORTER_OTLP_ENDPOINT`` (+ ``/v1/traces``) | ``endpoint`` |
| ``OTEL_EXPORTER_OTLP_TRACES_HEADERS``, ``OTEL_EXPORTER_OTLP_HEADERS`` | ``headers`` |
| ``OTEL_EXPORTER_OTLP_TRACES_TIMEOUT``, ``OTEL_EXPORTER_OTLP_TIMEOUT`` (ms) | ``export_timeout`` (s) |
| ``OTEL_EXPORTER_OTLP_TRACES_COMPRESSION``, ``OTEL_EXPORTER_OTLP_COMPRESSION`` | ``compression`` |
| ``OTEL_SERVICE_NAME`` | ``service_name`` |
| ``OTEL_RESOURCE_ATTRIBUTES`` | ``resource_attributes`` |
| ``OTEL_BSP_MAX_QUEUE_SIZE``, ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``, ``OTEL_BSP_SCHEDULE_DELAY`` (ms) | ``queue_size``, ``batch_size``, ``flush_seconds`` (s) |
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

OTLP_TRACES_PATH = "/v1/traces"


def _first(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return name, value
    return None


def _number(
    env: Mapping[str, str], names: tuple[str, ...], scale: float, integer: bool, problems: list[str]
) -> float | int | None:
    found = _first(env, *names)
    if found is None:
        return None
    name, text = found
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0 or (integer and value != int(value)):
        kind = "a positive integer" if integer else "a positive number"
        problems.append(f"variable {name}: expected {kind}, got {text[:40]!r}")
        return None
    return int(value) if integer else value * scale


def parse_pairs(text: str) -> dict[str, str] | None:
    """``k1=v1,k2=v2`` (the W3C baggage form the OTLP header and resource variables use; values
    percent-decoded); ``None`` when a member is not ``key=value``."""
    pairs: dict[str, str] = {}
    for member in text.split(","):
        if not member.strip():
            continue
        key, sep, value = member.partition("=")
        if not sep or not key.strip():
            return None
        pairs[unquote(key.strip())] = unquote(value.strip())
    return pairs


def sdk_disabled(env: Mapping[str, str]) -> bool:
    """``OTEL_SDK_DISABLED=true``: no traces, whatever the file says."""
    return env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def tracing_values(env: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """The ``tracing:`` values the environment gives, and its problems (never a value shown
    for the header variables: they carry collector credentials)."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter not in ("", "otlp", "none"):
        problems.append(
            f"variable OTEL_TRACES_EXPORTER: expected otlp or none (the proxy exports OTLP over"
            f" HTTP only), got {exporter[:40]!r}"
        )
    protocol = _first(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol is not None and protocol[1] != "http/protobuf":
        problems.append(
            f"variable {protocol[0]}: expected http/protobuf (the proxy's exporter), got"
            f" {protocol[1][:40]!r}"
        )
    endpoint = _first(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if endpoint is not None:
        values["endpoint"] = endpoint[1]
    elif (base := _first(env, "OTEL_EXPORTER_OTLP_ENDPOINT")) is not None:
        values["endpoint"] = base[1].rstrip("/") + OTLP_TRACES_PATH
    if exporter == "otlp" or "endpoint" in values:
        values["enabled"] = True
    if exporter == "none" or sdk_disabled(env):
        values["enabled"] = False
    headers = _first(env, "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")
    if headers is not None:
        if parse_pairs(headers[1]) is None:
            problems.append(f"variable {headers[0]}: expected key=value pairs separated by commas (not shown)")
        else:
            values["headers"] = headers[1]
    resource = _first(env, "OTEL_RESOURCE_ATTRIBUTES")
    if resource is not None:
        if parse_pairs(resource[1]) is None:
            problems.append("variable OTEL_RESOURCE_ATTRIBUTES: expected key=value pairs separated by commas")
        else:
            values["resource_attributes"] = resource[1]
    compression = _first(env, "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION")
    if compression is not None:
        if compression[1] not in ("none", "gzip"):
            problems.append(f"variable {compression[0]}: expected none or gzip, got {compression[1][:40]!r}")
        else:
            values["compression"] = compression[1]
    service = _first(env, "OTEL_SERVICE_NAME")
    if service is not None:
        values["service_name"] = service[1]
    numbers = (
        ("export_timeout", ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"), 0.001, False),
        ("queue_size", ("OTEL_BSP_MAX_QUEUE_SIZE",), 1.0, True),
        ("batch_size", ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE",), 1.0, True),
        ("flush_seconds", ("OTEL_BSP_SCHEDULE_DELAY",), 0.001, False),
    )
    for key, names, scale, integer in numbers:
        number = _number(env, names, scale, integer, problems)
        if number is not None:
            values[key] = number
    return values, problems
