"""The ``tracing:`` section: OpenTelemetry traces over OTLP/HTTP. The standard ``OTEL_*``
variables give its base (:mod:`proxy.config.tracing_env`, read by
:func:`proxy.config.settings.tracing_from_env`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.config.schema import check, doc, http_url, one_of, positive
from proxy.config.tracing_env import parse_pairs


def _pairs(value: str) -> str | None:
    return None if parse_pairs(value) is not None else "key=value pairs separated by commas"


@dataclass(frozen=True, slots=True)
class TracingConfig:
    enabled: bool = field(
        default=False,
        metadata=doc(
            "OpenTelemetry traces over OTLP/HTTP (protobuf; needs `pip install 'context-proxy[tracing]'`)."
            " Also on when `OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT` is set or `OTEL_TRACES_EXPORTER=otlp`;"
            " off with `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. A key in the file wins over"
            " its variable (`OTEL_SDK_DISABLED=true` wins over the file)."
        ),
    )
    endpoint: str = field(
        default="http://localhost:4318/v1/traces",
        metadata=check(
            http_url,
            doc="The collector's traces URL (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as is, or"
            " `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`).",
        ),
    )
    headers: str = field(
        default="",
        repr=False,
        metadata=check(
            _pairs,
            doc="Sent with every export (a collector's credentials): `k1=v1,k2=v2`, values"
            " percent-decoded (`OTEL_EXPORTER_OTLP[_TRACES]_HEADERS`); never printed.",
        ),
    )
    service_name: str = field(default="context-proxy", metadata=doc("The resource's `service.name` (`OTEL_SERVICE_NAME`)."))
    resource_attributes: str = field(
        default="",
        metadata=check(_pairs, doc="More resource attributes, `k1=v1,k2=v2` (`OTEL_RESOURCE_ATTRIBUTES`)."),
    )
    capture_content: bool = field(
        default=False,
        metadata=doc(
            "`true`: the prompt on call spans (`gen_ai.input.messages`, `gen_ai.system_instructions`);"
            " message content is never recorded otherwise."
        ),
    )
    queue_size: int = field(
        default=2048,
        metadata=check(
            positive,
            doc="Spans waiting for export; beyond it new spans are dropped (and counted), never waited on"
            " (`OTEL_BSP_MAX_QUEUE_SIZE`).",
        ),
    )
    batch_size: int = field(
        default=512, metadata=check(positive, doc="Spans per export (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`).")
    )
    flush_seconds: float = field(
        default=5.0,
        metadata=check(
            positive,
            doc="A batch leaves when full or this long after the previous one (`OTEL_BSP_SCHEDULE_DELAY`, in ms there).",
        ),
    )
    export_timeout: float = field(
        default=10.0,
        metadata=check(
            positive,
            doc="One export's deadline, retries included; then its spans are dropped (and counted)"
            " (`OTEL_EXPORTER_OTLP[_TRACES]_TIMEOUT`, in ms there).",
        ),
    )
    compression: str = field(
        default="none",
        metadata=check(one_of("none", "gzip"), doc="The exports' body (`OTEL_EXPORTER_OTLP[_TRACES]_COMPRESSION`)."),
    )
