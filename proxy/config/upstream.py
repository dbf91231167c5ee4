"""The ``upstream:`` section: where requests go (the Anthropic API, Bedrock Runtime, Vertex AI or
Microsoft Foundry), in the configuration and, as :class:`UpstreamTarget`, in a tenant policy."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from proxy.config.schema import check, doc, http_url, one_of, or_empty, positive
from proxy.core.platform_ids import GEOGRAPHIES, geography_for_region
from proxy.formats.bridging import path_problem

UPSTREAM_FORMATS = ("anthropic", "bedrock", "vertex", "foundry")
# Microsoft Entra ID's scope for Foundry's endpoints: what Claude Code 2.1.197 asks for in Foundry
# mode (its bundle: getBearerTokenProvider(new DefaultAzureCredential, "<this>"))
FOUNDRY_SCOPE = "https://cognitiveservices.azure.com/.default"
_RESOURCE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,62}$")
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _resource(value: str) -> str | None:
    if value == "" or _RESOURCE.match(value):
        return None
    return "a Foundry resource name (letters, digits and hyphens: <resource>.services.ai.azure.com)"


def _variable(value: str) -> str | None:
    if value == "" or _VARIABLE.match(value):
        return None
    return "the name of an environment variable (letters, digits, _), not the key itself"


def _scope(value: str) -> str | None:
    return None if value.startswith("https://") and value.endswith("/.default") else (
        "an Entra ID scope like https://cognitiveservices.azure.com/.default"
    )


@dataclass(frozen=True, slots=True)
class BetaFieldsConfig:
    """The body fields one beta enables (``proxy.formats.bridging``): dropped with it."""

    beta: str = field(
        default="",
        metadata=check(lambda v: None if v.strip() else "a beta name", doc="The beta's name (required)."),
    )
    fields: tuple[str, ...] = field(
        default=(),
        metadata=check(
            lambda v: next((p for p in map(path_problem, v) if p), None),
            doc="Body paths it enables: `a.b`, `a[]` (every item) or `a[type=x]`.",
        ),
    )


PROFILE_GEO_AUTO = "auto"


def _profile_geo(value: str) -> str | None:
    if value in ("", PROFILE_GEO_AUTO, *GEOGRAPHIES):
        return None
    return '"auto", "" (the base model id) or one of ' + ", ".join(GEOGRAPHIES)


@dataclass(frozen=True, slots=True)
class UpstreamTarget:
    """Which platform a tenant's requests go to (``upstream:`` in the config and in a policy)."""

    format: str = field(
        default="anthropic",
        metadata=check(
            one_of(*UPSTREAM_FORMATS),
            doc="The platform requests go to: `anthropic` (the Messages API at `upstream.base_url`),"
            " `bedrock` (Bedrock Runtime), `vertex` (Vertex AI) or `foundry` (Microsoft Foundry)."
            " A tenant policy's `upstream:` may choose another.",
        ),
    )
    endpoint_url: str = field(
        default="",
        metadata=check(
            or_empty(http_url),
            doc="`bedrock`/`vertex`/`foundry`: another endpoint (a VPC or private endpoint, a test"
            " fake); `\"\"` = the platform's public one (`https://bedrock-runtime.<region>.amazonaws.com`,"
            " `https://<location>-aiplatform.googleapis.com`, `https://<resource>.services.ai.azure.com/anthropic`)."
            " Foundry: the URL the Messages API's `/v1/messages` follows (it ends in `/anthropic`).",
        ),
    )
    region: str = field(default="", metadata=doc("`bedrock`: the AWS region (required with `bedrock`)."))
    profile_geo: str = field(
        default=PROFILE_GEO_AUTO,
        metadata=check(
            _profile_geo,
            doc="`bedrock`: the inference-profile geography put in front of a bare model id (`us`, `eu`,"
            " `apac`, `jp`, `au`, `ca`, `us-gov`, `global`); `auto` = the one Claude Code uses for"
            " `region` (`us-*` → `us`, `eu-*` → `eu`, `ap-*` → `apac`, else `global`); `\"\"` = the base"
            " model id. An ARN or an id that carries a geography is always sent as given.",
        ),
    )
    aws_profile: str = field(
        default="",
        metadata=doc("`bedrock`: a named profile of the AWS shared files; `\"\"` = botocore's default chain."),
    )
    project: str = field(default="", metadata=doc("`vertex`: the Google Cloud project (required with `vertex`)."))
    location: str = field(
        default="",
        metadata=doc(
            "`vertex`: the location (`us-east5`, `europe-west1`; `global` is the global endpoint;"
            " required with `vertex`)."
        ),
    )
    credentials_file: str = field(
        default="",
        metadata=doc(
            "`vertex`: a service-account or `authorized_user` JSON file; `\"\"` = application-default"
            " credentials."
        ),
    )
    resource: str = field(
        default="",
        metadata=check(
            _resource,
            doc="`foundry`: the Foundry resource (`https://<resource>.services.ai.azure.com/anthropic`);"
            " `resource` or `endpoint_url` is required with `foundry`.",
        ),
    )
    api_key_env: str = field(
        default="",
        metadata=check(
            _variable,
            doc="`foundry`: the environment variable holding the resource's API key (or `<VARIABLE>_FILE`"
            " naming a file that holds it), read at first use and again when Foundry refuses it;"
            " `\"\"` = Microsoft Entra ID through azure-identity's `DefaultAzureCredential` chain"
            " (environment, workload identity, managed identity, Azure CLI...).",
        ),
    )
    entra_scope: str = field(
        default=FOUNDRY_SCOPE,
        metadata=check(
            _scope,
            doc="`foundry` with Entra ID: the scope the token is asked for (Claude Code's;"
            " `https://ai.azure.com/.default` works too).",
        ),
    )
    accepted_betas: tuple[str, ...] = field(
        default=(),
        metadata=doc(
            "The betas the platform accepts; `[]` = the catalogue's list (`proxy/core/catalogue_data.py`;"
            " `foundry`: every beta, as the Claude API). Others are dropped with their body fields."
        ),
    )
    beta_fields: tuple[BetaFieldsConfig, ...] = field(
        default=(),
        metadata=doc(
            "The body fields a beta enables, dropped with it; an entry replaces the built-in pair for"
            " its beta."
        ),
    )

    def geography(self) -> str:
        """The inference-profile geography for this target's bare Bedrock ids (`""`: none)."""
        if self.profile_geo == PROFILE_GEO_AUTO:
            return geography_for_region(self.region) if self.region else ""
        return self.profile_geo

    def problems(self, prefix: str) -> list[str]:
        """What the chosen format still needs."""
        out: list[str] = []
        if self.format == "bedrock" and not self.region:
            out.append(f"key '{prefix}.region': expected an AWS region with format bedrock, missing")
        if self.format == "vertex":
            for key in ("project", "location"):
                if not getattr(self, key):
                    out.append(f"key '{prefix}.{key}': expected a value with format vertex, missing")
        if self.format == "foundry" and bool(self.resource) == bool(self.endpoint_url):
            out.append(
                f"key '{prefix}.resource': expected a Foundry resource name or an endpoint_url with"
                f" format foundry (one of them), got {'both' if self.resource else 'neither'}"
            )
        for i, entry in enumerate(self.beta_fields):
            if not entry.beta.strip():
                out.append(f"key '{prefix}.beta_fields[{i}].beta': expected a beta name, missing")
        return out


def target_of(upstream: UpstreamTarget) -> UpstreamTarget:
    """The platform part of ``upstream`` (an :class:`UpstreamConfig` is one, with more keys)."""
    return UpstreamTarget(**{f.name: getattr(upstream, f.name) for f in dataclasses.fields(UpstreamTarget)})


@dataclass(frozen=True, slots=True)
class UpstreamConfig(UpstreamTarget):
    base_url: str = field(
        default="https://api.anthropic.com",
        metadata=check(
            http_url,
            doc="The Messages API the `anthropic` format forwards to; a path prefix is honoured"
            " (`http://h:p/prefix` → `/prefix/v1/messages`).",
        ),
    )
    connect_timeout: float = field(
        default=10.0, metadata=check(positive, doc="Seconds to connect (then 504 `timeout_error`).")
    )
    read_timeout: float = field(
        default=600.0,
        metadata=check(
            positive,
            doc="Longest silence, in seconds, between two reads of the upstream answer (then 504"
            " before headers; SSE pings arrive about every 15 s).",
        ),
    )
    pool_size: int = field(
        default=512,
        metadata=check(positive, doc="Keep-alive connections to the upstream (one pooled session per process)."),
    )
