"""One model, three spellings: the Anthropic API's id, Bedrock's model id (or an inference
profile, or its ARN) and Vertex's model name.

The core works on Anthropic ids (model windows, the thinking-binding table, prices); a request
that arrived in Bedrock or Vertex form is named by its Anthropic id inside, and an upstream of
another format gets its own spelling back. A built-in table holds the published triples
(platform.claude.com "Models overview"; docs.cloud.google.com "Request predictions with Claude
models"); a config's entries come first. An id in no table is converted by the published
patterns: Bedrock ``[<geo>.]anthropic.<id>-v<n>[:<m>]``, Vertex ``<name>@<yyyymmdd>`` for dated
ids, the bare id otherwise.

Pure: strings in, strings out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# Bedrock cross-region inference profiles prefix the model id with a geography
_GEO = r"(?:us|eu|apac|jp|au|ca|us-gov|global)"
_BEDROCK = re.compile(rf"^(?:(?P<geo>{_GEO})\.)?anthropic\.(?P<id>.+?)(?:-v\d+(?::\d+)?)?$")
_ARN = re.compile(r"^arn:aws[\w-]*:bedrock:[^:]*:[^:]*:(?:inference-profile|foundation-model)/(?P<id>.+)$")
_VERTEX = re.compile(r"^(?P<name>claude-[\w.-]+?)@(?P<date>\d{8})$")
_DATED = re.compile(r"^(?P<name>claude-[\w.-]+?)-(?P<date>\d{8})$")


@dataclass(frozen=True, slots=True)
class ModelId:
    anthropic: str
    bedrock: str
    vertex: str
    # other Anthropic spellings of the same model (its undated alias)
    aliases: tuple[str, ...] = ()


BUILT_IN: tuple[ModelId, ...] = (
    ModelId("claude-opus-4-6", "anthropic.claude-opus-4-6-v1", "claude-opus-4-6"),
    ModelId("claude-sonnet-4-6", "anthropic.claude-sonnet-4-6", "claude-sonnet-4-6"),
    ModelId(
        "claude-opus-4-5-20251101", "anthropic.claude-opus-4-5-20251101-v1:0",
        "claude-opus-4-5@20251101", ("claude-opus-4-5",),
    ),
    ModelId(
        "claude-haiku-4-5-20251001", "anthropic.claude-haiku-4-5-20251001-v1:0",
        "claude-haiku-4-5@20251001", ("claude-haiku-4-5",),
    ),
    ModelId(
        "claude-sonnet-4-5-20250929", "anthropic.claude-sonnet-4-5-20250929-v1:0",
        "claude-sonnet-4-5@20250929", ("claude-sonnet-4-5",),
    ),
    ModelId(
        "claude-opus-4-1-20250805", "anthropic.claude-opus-4-1-20250805-v1:0",
        "claude-opus-4-1@20250805", ("claude-opus-4-1",),
    ),
    ModelId(
        "claude-opus-4-20250514", "anthropic.claude-opus-4-20250514-v1:0",
        "claude-opus-4@20250514", ("claude-opus-4-0",),
    ),
    ModelId(
        "claude-sonnet-4-20250514", "anthropic.claude-sonnet-4-20250514-v1:0",
        "claude-sonnet-4@20250514", ("claude-sonnet-4-0",),
    ),
    ModelId(
        "claude-3-7-sonnet-20250219", "anthropic.claude-3-7-sonnet-20250219-v1:0",
        "claude-3-7-sonnet@20250219", ("claude-3-7-sonnet-latest",),
    ),
    ModelId(
        "claude-3-5-haiku-20241022", "anthropic.claude-3-5-haiku-20241022-v1:0",
        "claude-3-5-haiku@20241022", ("claude-3-5-haiku-latest",),
    ),
)


class ModelIds:
    """The table: ``entries`` (a config's) first, then the built-ins."""

    def __init__(self, entries: Iterable[ModelId] = (), *, built_in: bool = True) -> None:
        self.entries = (*entries, *(BUILT_IN if built_in else ()))
        self._by_name: dict[str, ModelId] = {}
        for entry in reversed(self.entries):  # earlier entries win
            for name in (entry.anthropic, entry.bedrock, entry.vertex, *entry.aliases):
                self._by_name[name] = entry

    def find(self, model: str) -> ModelId | None:
        entry = self._by_name.get(model)
        if entry is not None:
            return entry
        bare = _bedrock_bare(model)
        return self._by_name.get(bare) if bare is not None else None

    def anthropic(self, model: str) -> str:
        """The Anthropic id of any spelling (unknown strings come back unchanged)."""
        entry = self.find(model)
        if entry is not None:
            return entry.anthropic
        arn = _ARN.match(model)
        if arn:
            model = arn.group("id")
        bedrock = _BEDROCK.match(model)
        if bedrock:
            return bedrock.group("id")
        vertex = _VERTEX.match(model)
        if vertex:
            return f"{vertex.group('name')}-{vertex.group('date')}"
        return model

    def bedrock(self, model: str, geo: str | None = None) -> str:
        """Bedrock's id; with ``geo`` (``us``, ``eu``, ``global``...) its inference profile.
        An ARN or a spelling already in Bedrock form is kept as sent."""
        if model.startswith("arn:") or _BEDROCK.match(model):
            return model
        entry = self.find(model)
        bare = entry.bedrock if entry is not None else f"anthropic.{self.anthropic(model)}-v1:0"
        return f"{geo}.{bare}" if geo else bare

    def vertex(self, model: str) -> str:
        """Vertex's model name."""
        entry = self.find(model)
        if entry is not None:
            return entry.vertex
        anthropic = self.anthropic(model)
        dated = _DATED.match(anthropic)
        return f"{dated.group('name')}@{dated.group('date')}" if dated else anthropic


def _bedrock_bare(model: str) -> str | None:
    """``us.anthropic.x-v1:0`` or its ARN → ``anthropic.x-v1:0`` (the table's spelling)."""
    arn = _ARN.match(model)
    if arn:
        model = arn.group("id")
    match = _BEDROCK.match(model)
    if not match:
        return None
    return model.split(".", 1)[1] if match.group("geo") else model
