"""``tracing:`` and the standard ``OTEL_*`` variables (proxy/config/tracing_env.py, proxy/config/settings.py):
which variables turn traces on, their units, what a key in the file overrides, what the proxy
refuses to start with, and that a collector's credentials are never printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config.schema import ConfigError
from proxy.config.settings import load_config, parse_config
from proxy.config.tracing import TracingConfig


def _tracing(env: dict[str, str], path: Path | None = None) -> TracingConfig:
    return load_config(path, env=True, environ=env).tracing


def test_off_by_default_and_without_otel_variables() -> None:
    assert _tracing({}) == TracingConfig()
    assert TracingConfig().enabled is False
    assert _tracing({"PATH": "/bin", "OTEL_SERVICE_NAME": "x"}).enabled is False


@pytest.mark.parametrize(
    ("env", "endpoint"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "http://collector:4318/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}, "http://collector:4318/v1/traces"),
        (  # the signal's own variable is used as it is, and wins
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:1", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://b:2/custom"},
            "https://b:2/custom",
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "http://localhost:4318/v1/traces"),
    ],
)
def test_an_endpoint_or_the_otlp_exporter_turns_traces_on(env: dict[str, str], endpoint: str) -> None:
    tracing = _tracing(env)
    assert tracing.enabled is True and tracing.endpoint == endpoint


@pytest.mark.parametrize(
    "off", [{"OTEL_SDK_DISABLED": "true"}, {"OTEL_TRACES_EXPORTER": "none"}]
)
def test_the_standard_off_switches(off: dict[str, str]) -> None:
    assert _tracing({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", **off}).enabled is False


def test_durations_are_milliseconds_and_the_rest_is_carried_over() -> None:
    tracing = _tracing(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_BSP_MAX_QUEUE_SIZE": "64",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "16",
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20abc,x-team=ops",
            "OTEL_SERVICE_NAME": "edge-proxy",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        }
    )
    assert (tracing.export_timeout, tracing.flush_seconds) == (2.5, 0.2)
    assert (tracing.queue_size, tracing.batch_size) == (64, 16)
    assert tracing.headers == "authorization=Bearer%20abc,x-team=ops"
    assert (tracing.service_name, tracing.resource_attributes) == ("edge-proxy", "deployment.environment=prod")


def test_a_key_in_the_file_wins_over_a_variable(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("tracing:\n  enabled: false\n  service_name: from-file\n")
    tracing = _tracing({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SERVICE_NAME": "env"}, path)
    assert tracing.enabled is False and tracing.service_name == "from-file"
    assert tracing.endpoint == "http://c:4318/v1/traces"  # not in the file: the variable's
    # without env=True (check-config), the variables are not read
    assert load_config(path).tracing.endpoint == TracingConfig().endpoint


def test_what_the_proxy_cannot_honour_stops_the_start_without_showing_credentials() -> None:
    env = {
        "OTEL_TRACES_EXPORTER": "zipkin",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_HEADERS": "s3cr3t-no-equals-sign",
        "OTEL_BSP_MAX_QUEUE_SIZE": "lots",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "-1",
    }
    with pytest.raises(ConfigError) as caught:
        _tracing(env)
    text = str(caught.value)
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_HEADERS",
                 "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        assert name in text
    assert "s3cr3t" not in text


def test_bad_file_keys_are_named_and_headers_never_shown() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(
            {"tracing": {"endpoint": "grpc://c:4317", "headers": "token-without-pair", "queue_size": 0, "capture": True}}
        )
    text = str(caught.value)
    assert "tracing.endpoint" in text and "tracing.queue_size" in text
    assert "tracing.headers" in text and "token-without-pair" not in text
    assert "key 'tracing.capture': unknown key" in text


def test_tracing_on_without_the_extra_is_a_config_error_naming_it(tmp_path: Path) -> None:
    """Without OpenTelemetry installed (its import blocked here), ``tracing.enabled`` stops the
    start with the extra to install, not a traceback."""
    import subprocess
    import sys

    script = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from proxy.config.settings import parse_config\nfrom proxy.config.schema import ConfigError\n"
        "from proxy.server.app import build_app\n"
        "try:\n"
        f"    build_app(parse_config({{'tracing': {{'enabled': True}}, 'state_dir': {str(tmp_path)!r}}}))\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1])
    assert "key 'tracing.enabled'" in out.stdout and "pip install 'context-proxy[tracing]'" in out.stdout, out.stderr
    assert "opentelemetry is not installed" in out.stdout


def test_the_sdks_off_switch_wins_over_the_file_and_compression_is_read(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("tracing:\n  enabled: true\n")
    assert _tracing({}, path).enabled is True
    assert _tracing({"OTEL_SDK_DISABLED": "true"}, path).enabled is False
    assert _tracing({"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}).compression == "gzip"
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_TRACES_COMPRESSION: expected none or gzip"):
        _tracing({"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "zstd"})
    with pytest.raises(ConfigError, match=r"tracing\.compression"):
        parse_config({"tracing": {"compression": "br"}})
    assert "headers" not in repr(TracingConfig(headers="authorization=Bearer%20x"))
