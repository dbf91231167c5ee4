"""Claude Code's own model catalogue and per-platform betas, read from the pinned CLI's bundle.

Claude Code ships as a native binary with its JavaScript bundle embedded. The bundle holds a
hand-maintained model catalogue (its comment: "the source of truth for per-model provider IDs"):
``{schema_version:1,models:[{id, family, display_name, provider_ids:{first_party, bedrock,
vertex, foundry, ...}, context:{window, native_1m, supports_1m_beta}, ...}], aliases, ...}``.
Its beta registry names each beta once (``X=FE("effort","effort-2025-11-24")``), and two sets
say what it sends to the third-party platforms:

* the betas it lets through to Bedrock and Vertex at all (``if(SET.has(s))return!0; …
  `SDK beta '${s.header}' dropped on 3P```): Vertex gets each in its ``anthropic-beta`` header;
* the ones it moves into Bedrock's body ``anthropic_beta`` (``if(l_(e)==="bedrock")return
  t.filter((n)=>!SET.has(n))``: taken out of the header list, sent in the body).

The filter applies only off the providers that get every beta as the Claude API does
(``if(!YM())o=o.filter(...)``, ``YM`` = ``D6r()&&...``, ``D6r`` = ``e==="firstParty"||...``):
:func:`read_full_beta_providers` reads that list (``foundry`` is in it: Claude Code sends Foundry
its first-party betas).

The bundle is minified, so the reader anchors on strings and shapes, not on names; when a new
Claude Code changes them, :class:`BundleChanged` says which anchor was not found.
"""

from __future__ import annotations

import json
import mmap
import re
from dataclasses import dataclass
from pathlib import Path

from tests.test_claude_code import REPO as REPO

PINNED_VERSION = "2.1.197"
_PACKAGE = REPO / ".ci" / "node" / "node_modules" / "@anthropic-ai"
NATIVE = _PACKAGE / "claude-code-linux-x64" / "claude"
# 3P: Claude Code's word for the platforms other than the Claude API (Bedrock, Vertex, ...)
_CATALOGUE_ANCHOR = b"schema_version:1,models:["
_DROPPED_ANCHOR = b"dropped on 3P"
_BEDROCK_BODY = re.compile(rb'==="bedrock"\)return (\w+)\.filter\(\((\w+)\)=>!([\w$]+)\.has\(\2\)\)')


class BundleChanged(AssertionError):
    """The bundle no longer has a shape this reader knows."""


@dataclass(frozen=True)
class CcModel:
    id: str  # Claude Code's name for the model (``claude-opus-4-0``)
    first_party: str
    bedrock: str | None
    vertex: str | None
    foundry: str | None
    window: int | None  # ``context.window`` (None: no context entry)
    supports_1m_beta: bool


_FILTER_GATE = re.compile(rb"if\(!([\w$]+)\(\)\)\w+=\w+\.filter")


def read_full_beta_providers(path: Path) -> frozenset[str]:
    """The providers Claude Code sends every beta it sends the Claude API (no third-party filter)."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        for at in _occurrences(data, _DROPPED_ANCHOR):
            gate = _FILTER_GATE.search(bytes(data[max(0, at - 400) : at]))
            if gate is not None:
                source = bytes(data[max(0, at - 200_000) : at + 10_000])
                break
        else:
            raise BundleChanged("no gate (if(!GATE())o=o.filter(...)) before 'dropped on 3P' found")
    inner = re.search(rb"function " + re.escape(gate.group(1)) + rb"\(\)\{return ([\w$]+)\(\)&&", source)
    if inner is None:
        raise BundleChanged(f"no function {gate.group(1).decode()}(){{return X()&&...}} found")
    listed = re.search(
        rb"function " + re.escape(inner.group(1))
        + rb'\(\)\{let (\w+)=[\w$]+\(\);return ((?:\1==="\w+"\|\|)*\1==="\w+")\}',
        source,
    )
    if listed is None:
        raise BundleChanged(f"no provider list in function {inner.group(1).decode()}() found")
    return frozenset(re.findall(r'"(\w+)"', listed.group(2).decode()))


@dataclass(frozen=True)
class CcBetas:
    registry: dict[str, str]  # variable -> header
    third_party: frozenset[str]  # what it lets through to Bedrock and Vertex
    bedrock_body: frozenset[str]  # what it sends to Bedrock in the body's anthropic_beta

    @property
    def vertex(self) -> frozenset[str]:
        return self.third_party

    @property
    def bedrock(self) -> frozenset[str]:
        return self.third_party & self.bedrock_body


def installed_version() -> str | None:
    package = _PACKAGE / "claude-code" / "package.json"
    if not package.is_file():
        return None
    version = json.loads(package.read_text())["version"]
    return str(version)


def bundle() -> Path | None:
    return NATIVE if NATIVE.is_file() else None


def _object_at(data: mmap.mmap, start: int) -> bytes:
    """The JavaScript object literal that opens at ``start`` (brace-matched, strings skipped)."""
    depth = 0
    i = start
    quote = 0
    while i < len(data):
        c = data[i]
        if quote:
            if c == 0x5C:  # backslash
                i += 2
                continue
            if c == quote:
                quote = 0
        elif c in (0x22, 0x27, 0x60):
            quote = c
        elif c == 0x7B:
            depth += 1
        elif c == 0x7D:
            depth -= 1
            if depth == 0:
                return bytes(data[start : i + 1])
        i += 1
    raise BundleChanged("the model catalogue's object never closes")


_KEY = re.compile(r'([{,])([A-Za-z_$][\w$]*):')


def _js_to_json(text: str) -> object:
    """A JS object literal of plain data as JSON: bare keys quoted, ``!0``/``!1`` as booleans."""
    out: list[str] = []
    i = 0
    for match in re.finditer(r'"(?:[^"\\]|\\.)*"', text):  # leave string contents alone
        out.append(_plain(text[i : match.start()]))
        out.append(match.group(0))
        i = match.end()
    out.append(_plain(text[i:]))
    return json.loads("".join(out))


def _plain(code: str) -> str:
    code = code.replace("!0", "true").replace("!1", "false")
    return _KEY.sub(lambda m: f'{m.group(1)}"{m.group(2)}":', code)


def read_models(path: Path) -> list[CcModel]:
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        at = data.find(_CATALOGUE_ANCHOR)
        if at < 0:
            raise BundleChanged(f"no {_CATALOGUE_ANCHOR.decode()!r} in the bundle")
        start = data.rfind(b"{", 0, at)
        literal = _object_at(data, start).decode()
    catalogue = _js_to_json(literal)
    assert isinstance(catalogue, dict)
    models = []
    for m in catalogue["models"]:
        ids = m["provider_ids"]
        context = m.get("context") or {}
        models.append(
            CcModel(
                m["id"], ids["first_party"], ids.get("bedrock"), ids.get("vertex"), ids.get("foundry"),
                int(context["window"]) if "window" in context else None,
                bool(context.get("supports_1m_beta")),
            )
        )
    if not models:
        raise BundleChanged("the model catalogue lists no model")
    return models


def _occurrences(data: mmap.mmap, needle: bytes) -> list[int]:
    out, at = [], data.find(needle)
    while at >= 0:
        out.append(at)
        at = data.find(needle, at + 1)
    return out


_REGISTRY = re.compile(rb'([\w$]+)=\w+\("(\w+)","([a-z0-9-]+-\d{4}-?\d{2}-?\d{2})"\)')
_ALLOWED = re.compile(rb"if\(([\w$]+)\.has\(\w+\)\)return!0")


def read_betas(path: Path) -> CcBetas:
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        registry: dict[str, str] = {}
        for at in _occurrences(data, b'"effort-2025-11-24"'):  # the registry: NAME=FE("x","x-date")
            window = bytes(data[max(0, at - 4096) : at + 4096])
            found = {m.group(1).decode(): m.group(3).decode() for m in _REGISTRY.finditer(window)}
            if len(found) > len(registry):
                registry, around = found, at
        if "effort-2025-11-24" not in registry.values():
            raise BundleChanged('no beta registry (NAME=FE("effort","effort-2025-11-24")) found')
        allowed = None
        for at in _occurrences(data, _DROPPED_ANCHOR):
            names = _ALLOWED.findall(bytes(data[max(0, at - 300) : at]))
            if names:
                allowed = names[-1].decode()
                source = bytes(data[max(0, at - 2_000_000) : at + 2_000_000])
                break
        if allowed is None:
            raise BundleChanged("no third-party beta filter (SET.has(...) before 'dropped on 3P') found")
        body = _BEDROCK_BODY.search(source)
        if body is None:
            raise BundleChanged("no Bedrock body-beta filter (==='bedrock')return t.filter(...)) found")
        sets = bytes(data[max(0, around - 8192) : around + 8192]) + source
    return CcBetas(
        registry, _set_of(sets, allowed, registry), _set_of(sets, body.group(3).decode(), registry)
    )


def _set_of(text: bytes, name: str, registry: dict[str, str]) -> frozenset[str]:
    found = re.search(rb"[,;]" + re.escape(name.encode()) + rb"=new Set\(\[([\w$,]*)\]\)", text)
    if found is None:
        raise BundleChanged(f"no {name}=new Set([...]) found")
    members = [m for m in found.group(1).decode().split(",") if m]
    unknown = [m for m in members if m not in registry]
    if unknown:
        raise BundleChanged(f"{name} holds names the beta registry does not: {unknown}")
    return frozenset(registry[m] for m in members)
