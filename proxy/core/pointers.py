"""Source pointers: the strict grammar, parsed before anything is looked up.

A durable fact, pending item or piece of evidence names where it came from with a *source
pointer*. Every turn the proxy re-verifies each pointer (``proxy.sources.resolver``); this module
only decides what a pointer *is*. It does no I/O.

Grammar (whole-string matches only, ASCII only)::

    pointer    = transcript | artifact | other
    transcript = "transcript:" component [":" component] ":" sequence   ; session [agent]
    artifact   = "artifact:" component ":" component ":" digest
    component  = [A-Za-z0-9] [A-Za-z0-9._-]{0,199}      ; see the exclusions below
    sequence   = [1-9] [0-9]{0,17}                       ; 1 .. 10**18 - 1, no sign, no leading 0
    digest     = 12 or 64 of [0-9a-f]                    ; lowercase only
    other      = scheme 1*(":" component)                ; the generic shape, unknown scheme
    scheme     = [a-z] [a-z0-9-]{0,31}

Outcomes of :func:`parse_pointer`:

* a :class:`TranscriptPointer` or an :class:`ArtifactPointer` (always canonical: ``format_pointer``
  gives back the exact input). A transcript pointer with two fields names an event of the
  session's main conversation (``transcript:<session>:<seq>``, the form every pointer had before
  agents); with three, an event of one of its agents' conversations
  (``transcript:<session>:<agent>:<seq>``: a subagent Claude Code spawned, or any client's
  ``x-agent-id``). The number of fields decides, so the two never mean the same event;
* ``BadPointer("unsupported")`` for a pointer of the generic shape (a lowercase scheme, then one or
  more ``:``-separated valid components) whose scheme this proxy does not know (``store:s1:42``):
  a newer writer may use it, so it is reported as such rather than as damage. Something that does
  not even have the generic shape (``file:///etc/passwd``, ``a.txt::$DATA``) is ``corrupt``;
* ``BadPointer("corrupt")`` for everything else: a non-``str``, an empty string, anything longer
  than :data:`MAX_POINTER_LENGTH`, any non-ASCII character (so no Unicode digits, no full-width
  colons or dots, no NFKC tricks: nothing is normalised, decoded or stripped), any whitespace or
  control character (including a trailing newline or a NUL), a scheme that is not lowercase, and a
  known scheme whose fields do not match exactly (missing or extra fields, empty components, ``+1``,
  ``01``, ``0``, ``1_000``, ``1e3``, uppercase or wrong-length hex, ``%2e%2e``...).

Decisions
---------
* Components are file names in the trusted roots, so the grammar is the first line of defence:
  no ``/``, ``\\``, ``:``, ``%``, no leading ``.`` or ``-`` (so never ``.``/``..``, never a hidden or
  temporary file, never an option-looking name). ``.`` and ``..`` are also rejected explicitly.
* Names that Windows aliases are corrupt: device names (``CON``, ``PRN``, ``AUX``, ``NUL``,
  ``COM0``-``COM9``, ``LPT0``-``LPT9``, any case, with or without an extension) and names ending in
  ``.`` (``a.txt.`` is ``a.txt`` there). The roots may be synced to or mounted on other systems,
  and one file must have one name.
* Digests are lowercase hex only; uppercase is corrupt rather than canonicalised, so one artifact
  has exactly one spelling per prefix length (pointers are compared and deduplicated as text).
* ``BadPointer.reason`` is fixed text chosen here; it never echoes the input (no log injection).
* Parsing is memoised (a bounded LRU keyed by the exact ``str``): a durable state re-parses the
  same pointers every turn, and the results are immutable.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import ClassVar, Literal

from proxy.core.bounded import FunctionMemo

__all__ = [
    "ARTIFACT",
    "KINDS",
    "MAX_COMPONENT_LENGTH",
    "MAX_POINTER_LENGTH",
    "MAX_SEQUENCE",
    "TRANSCRIPT",
    "ArtifactPointer",
    "BadPointer",
    "ParsedPointer",
    "Pointer",
    "PointerKind",
    "format_pointer",
    "is_valid_agent_id",
    "is_valid_component",
    "is_valid_digest",
    "is_valid_session_id",
    "parse_pointer",
]

PointerKind = Literal["transcript", "artifact"]
TRANSCRIPT: PointerKind = "transcript"
ARTIFACT: PointerKind = "artifact"
KINDS: frozenset[str] = frozenset({TRANSCRIPT, ARTIFACT})

MAX_COMPONENT_LENGTH = 200
MAX_SEQUENCE = 10**18 - 1
# "artifact:" + component + ":" + component + ":" + 64 hex = 475; anything longer is corrupt
# before a regular expression sees it.
MAX_POINTER_LENGTH = 9 + MAX_COMPONENT_LENGTH + 1 + MAX_COMPONENT_LENGTH + 1 + 64

_COMPONENT = r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}"
_SEQUENCE = r"[1-9][0-9]{0,17}"
_DIGEST = r"[0-9a-f]{64}|[0-9a-f]{12}"

_COMPONENT_RE = re.compile(_COMPONENT, re.ASCII)
_DIGEST_RE = re.compile(_DIGEST, re.ASCII)
_PRINTABLE_RE = re.compile(r"[\x21-\x7e]+", re.ASCII)
_SCHEME_RE = re.compile(r"[a-z][a-z0-9-]{0,31}", re.ASCII)
_TRANSCRIPT_RE = re.compile(
    rf"transcript:({_COMPONENT})(?::({_COMPONENT}))?:({_SEQUENCE})", re.ASCII
)
_ARTIFACT_RE = re.compile(rf"artifact:({_COMPONENT}):({_COMPONENT}):({_DIGEST})", re.ASCII)
_DEVICE_NAME_RE = re.compile(r"(?:con|prn|aux|nul|com[0-9]|lpt[0-9])(?:\..*)?", re.ASCII | re.I)


def is_valid_component(value: object) -> bool:
    """True when ``value`` is a ``str`` usable as one pointer component (a session or a name)."""
    return (
        isinstance(value, str)
        and _COMPONENT_RE.fullmatch(value) is not None
        and value not in (".", "..")
        and not value.endswith(".")
        and _DEVICE_NAME_RE.fullmatch(value) is None
    )


def is_valid_session_id(value: object) -> bool:
    """Session ids follow the component grammar (they name files and directories)."""
    return is_valid_component(value)


def is_valid_agent_id(value: object) -> bool:
    """Agent ids too (``""`` is the session's main conversation, never written in a pointer)."""
    return is_valid_component(value)


def is_valid_digest(value: object) -> bool:
    """12 or 64 lowercase hex digits (a prefix of, or a whole, SHA-256 hex digest)."""
    return isinstance(value, str) and _DIGEST_RE.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class TranscriptPointer:
    """``transcript:<session>:<sequence>``: the event with that ``sequence`` in the log of the
    session's main conversation; ``transcript:<session>:<agent>:<sequence>``: in the log of one
    of its agents (``agent`` non-empty)."""

    kind: ClassVar[PointerKind] = "transcript"
    session: str
    sequence: int
    agent: str = ""

    def __post_init__(self) -> None:
        if not is_valid_session_id(self.session):
            raise ValueError("invalid session id")
        if type(self.sequence) is not int or not 1 <= self.sequence <= MAX_SEQUENCE:
            raise ValueError("invalid sequence")
        if self.agent != "" and not is_valid_agent_id(self.agent):
            raise ValueError("invalid agent id")


@dataclass(frozen=True, slots=True)
class ArtifactPointer:
    """``artifact:<session>:<name>:<digest>``: a tool-result file and (a prefix of) its SHA-256."""

    kind: ClassVar[PointerKind] = "artifact"
    session: str
    name: str
    digest: str

    def __post_init__(self) -> None:
        if not is_valid_session_id(self.session):
            raise ValueError("invalid session id")
        if not is_valid_component(self.name):
            raise ValueError("invalid artifact name")
        if not is_valid_digest(self.digest):
            raise ValueError("invalid digest")


@dataclass(frozen=True, slots=True)
class BadPointer:
    """A pointer that cannot be looked up: ``corrupt`` (malformed) or ``unsupported`` (scheme)."""

    status: Literal["corrupt", "unsupported"]
    reason: str


Pointer = TranscriptPointer | ArtifactPointer
ParsedPointer = TranscriptPointer | ArtifactPointer | BadPointer


def _corrupt(reason: str) -> BadPointer:
    return BadPointer("corrupt", reason)


def parse_pointer(text: object) -> ParsedPointer:
    """Parse a source pointer; never raises. See the module docstring for the grammar."""
    if not isinstance(text, str):
        return _corrupt("not a string")
    if len(text) > MAX_POINTER_LENGTH:
        return _corrupt("too long")
    # Memoised: a durable state re-parses the same pointers every turn; results are immutable.
    # An exact str is the key, never a subclass with its own __eq__/__hash__/split.
    return _parse_str(text if type(text) is str else str.__str__(text))


@functools.lru_cache(maxsize=8192)
def _parse_str(text: str) -> ParsedPointer:
    """``parse_pointer`` of an exact ``str`` (memoised: ``PARSES``)."""
    if not text:
        return _corrupt("empty")
    if not text.isascii():
        return _corrupt("non-ASCII character")
    if _PRINTABLE_RE.fullmatch(text) is None:
        return _corrupt("whitespace or control character")
    scheme, *fields = text.split(":")
    if not fields:
        return _corrupt("no scheme")
    if _SCHEME_RE.fullmatch(scheme) is None:
        return _corrupt("malformed scheme")
    if scheme == TRANSCRIPT:
        m = _TRANSCRIPT_RE.fullmatch(text)
        if (
            m is None
            or not is_valid_session_id(m[1])
            or (m[2] is not None and not is_valid_agent_id(m[2]))
        ):
            return _corrupt("malformed transcript pointer")
        return TranscriptPointer(m[1], int(m[3]), m[2] or "")
    if scheme == ARTIFACT:
        m = _ARTIFACT_RE.fullmatch(text)
        if m is None or not is_valid_session_id(m[1]) or not is_valid_component(m[2]):
            return _corrupt("malformed artifact pointer")
        return ArtifactPointer(m[1], m[2], m[3])
    if not all(is_valid_component(field) for field in fields):
        return _corrupt("malformed pointer")
    return BadPointer("unsupported", "unknown scheme")


def format_pointer(pointer: Pointer) -> str:
    """The canonical text of a pointer; ``parse_pointer(format_pointer(p)) == p``."""
    if isinstance(pointer, TranscriptPointer):
        if pointer.agent:
            return f"transcript:{pointer.session}:{pointer.agent}:{pointer.sequence}"
        return f"transcript:{pointer.session}:{pointer.sequence}"
    return f"artifact:{pointer.session}:{pointer.name}:{pointer.digest}"


# the parse memo, for the metrics (``pointer_parses``): a pointer's text and its parsed value
PARSES = FunctionMemo("pointer_parses", _parse_str, entry_bytes=400)
