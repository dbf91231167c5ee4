"""How the platforms spell model ids: the published rules, as string functions. Pure.

The catalogue (:mod:`proxy.core.catalogue`) holds each model's spellings as the platforms publish
them; these functions read a spelling it does not list and make one for a model it does not know.
The rules, from platform.claude.com "Model IDs and versions"
(https://platform.claude.com/docs/en/about-claude/models/model-ids-and-versions):

* Claude API ids before the 4.6 generation carry a snapshot date (``claude-sonnet-4-5-20250929``);
  from 4.6 on they are dateless (``claude-opus-4-8``).
* Amazon Bedrock: ``anthropic.<id>-v1:0`` for a dated id, ``anthropic.<id>`` for a dateless one
  ("Claude Opus 4.6 is the last Bedrock model ID to include the -v1 suffix"); a cross-region
  inference profile puts a geography first (``us.anthropic.claude-opus-4-8``); an ARN names a
  foundation model, a system inference profile or an application inference profile.
* Google Cloud Vertex AI: ``<name>@<yyyymmdd>`` for a dated id, the Claude API id otherwise.

Which geography a profile takes from the region is Claude Code's rule (its 2.1.197 bundle:
``us-gov-*`` → ``us-gov``, ``us-*`` → ``us``, ``eu-*`` → ``eu``, ``ap-*`` → ``apac``, anything
else → ``global``).
"""

from __future__ import annotations

import re

__all__ = [
    "GEOGRAPHIES",
    "anthropic_of",
    "bedrock_rule",
    "carries_geography",
    "foundation_of",
    "geography_for_region",
    "is_arn",
    "is_bedrock_form",
    "vertex_rule",
    "with_geography",
]

# Bedrock's cross-region inference profile prefixes (AWS "Supported Regions and models for
# inference profiles"; Claude Code 2.1.197 knows us, eu, apac, jp, au, us-gov, global)
GEOGRAPHIES = ("us", "eu", "apac", "jp", "au", "ca", "us-gov", "global")
_GEO = "|".join(re.escape(g) for g in sorted(GEOGRAPHIES, key=len, reverse=True))
_BEDROCK = re.compile(rf"^(?:(?P<geo>{_GEO})\.)?anthropic\.(?P<id>.+?)(?:-v\d+(?::\d+)?)?$")
_ARN = re.compile(r"^arn:aws[\w-]*:bedrock:[^:]*:[^:]*:(?P<kind>[\w-]+)/(?P<rest>.+)$")
_VERTEX = re.compile(r"^(?P<name>claude-[\w.-]+?)@(?P<date>\d{8})$")
_DATED = re.compile(r"^(?P<name>claude-[\w.-]+?)-(?P<date>\d{8})$")


def is_arn(model: str) -> bool:
    return model.startswith("arn:")


def is_bedrock_form(model: str) -> bool:
    """``[<geo>.]anthropic.<id>[-v<n>[:<m>]]``: a Bedrock model id or system inference profile."""
    return _BEDROCK.match(model) is not None


def carries_geography(model: str) -> bool:
    """A Bedrock id with a geography already (``eu.anthropic.x``): sent as given."""
    found = _BEDROCK.match(model)
    return found is not None and found.group("geo") is not None


def foundation_of(model: str) -> str:
    """The foundation model id in a Bedrock spelling: ``us.anthropic.x`` → ``anthropic.x``, the
    model of a foundation-model or system-profile ARN; anything else as it is (an application
    inference profile names no model)."""
    arn = _ARN.match(model)
    if arn and arn.group("kind") in ("foundation-model", "inference-profile"):
        model = arn.group("rest")
    found = _BEDROCK.match(model)
    if found and found.group("geo"):
        return model.split(".", 1)[1]
    return model


def anthropic_of(model: str) -> str | None:
    """The Claude API id a platform spelling stands for, by the patterns above (``None``: not a
    platform spelling): a Bedrock id or profile (its ``-v…`` suffix dropped), the model of a
    foundation-model or system-profile ARN, a Vertex ``name@date``."""
    arn = _ARN.match(model)
    if arn:
        if arn.group("kind") not in ("foundation-model", "inference-profile"):
            return None
        model = arn.group("rest")
    found = _BEDROCK.match(model)
    if found:
        return found.group("id")
    vertex = _VERTEX.match(model)
    if vertex:
        return f"{vertex.group('name')}-{vertex.group('date')}"
    return None


def bedrock_rule(anthropic_id: str) -> str:
    """Bedrock's base id for a Claude API id by the published rule (a dated id gets ``-v1:0``)."""
    return f"anthropic.{anthropic_id}-v1:0" if _DATED.match(anthropic_id) else f"anthropic.{anthropic_id}"


def vertex_rule(anthropic_id: str) -> str:
    """Vertex's name for a Claude API id by the published rule (``name@date`` when dated)."""
    dated = _DATED.match(anthropic_id)
    return f"{dated.group('name')}@{dated.group('date')}" if dated else anthropic_id


def with_geography(model: str, geography: str) -> str:
    """``model`` as the inference profile of ``geography``: only a bare Bedrock id
    (``anthropic.x``) gets one; an ARN, an id that carries a geography already and anything
    else are sent as given."""
    if not geography or is_arn(model) or not model.startswith("anthropic."):
        return model
    return f"{geography}.{model}"


def geography_for_region(region: str) -> str:
    """The inference-profile geography Claude Code uses for an AWS region."""
    if region.startswith("us-gov-"):
        return "us-gov"
    for prefix, geography in (("us-", "us"), ("eu-", "eu"), ("ap-", "apac")):
        if region.startswith(prefix):
            return geography
    return "global"
