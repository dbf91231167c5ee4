"""A tenant's source policy: which pointers it may follow, and from which trusted roots.

Pure: a frozen value built once from configuration, and :func:`authorise`, which the resolver
calls after parsing and before any filesystem or store lookup. A pointer is ``denied`` when

* its kind (``transcript`` / ``artifact``) is not in ``allowed_kinds``, or
* its root for that kind is not configured (``None``), or
* its session matches none of ``session_patterns``.

Session patterns are shell-style globs matched case-sensitively over the whole session id
(:func:`fnmatch.fnmatchcase`: ``*``, ``?``, ``[seq]``, ``[!seq]``). Globs rather than regular
expressions: they are what operators write in YAML, they cannot be made to backtrack
catastrophically, and session ids are already restricted to ``[A-Za-z0-9._-]`` by the grammar, so
there is nothing a regular expression could express here that matters. An empty tuple allows no
session. ``"*"`` allows every session under the tenant's own roots: isolation between tenants
comes from the roots (each tenant has its own), not from the patterns.

With ``object_store`` set, artifacts are read from and written to that store under the
tenant's key prefix (``artifact_root`` is then unused) and every artifact needs a manifest entry
signed with one of ``signing``'s keys. Authorisation is the same: decided here, before any lookup.

Roots are absolute paths of directories the proxy trusts (the root path itself may contain
symlinks; nothing below it may). They are plain strings here; this module never touches them.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.core.pointers import KINDS, Pointer, TranscriptPointer

if TYPE_CHECKING:
    from proxy.sources.manifests import SigningKeys
    from proxy.sources.object_store import ObjectStoreSettings

__all__ = ["SourcePolicy", "authorise"]


@dataclass(frozen=True, slots=True)
class SourcePolicy:
    allowed_kinds: frozenset[str]
    session_patterns: tuple[str, ...]
    transcript_root: str | None = None
    artifact_root: str | None = None
    # Artifacts on an S3-compatible store instead of artifact_root (proxy.sources.store_artifacts)
    object_store: ObjectStoreSettings | None = None
    # Manifest signing keys (proxy.sources.manifests); required with object_store
    signing: SigningKeys | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.allowed_kinds, frozenset) or not self.allowed_kinds <= KINDS:
            raise ValueError(f"allowed_kinds must be a frozenset of {sorted(KINDS)}")
        if not isinstance(self.session_patterns, tuple):
            raise ValueError("session_patterns must be a tuple of glob patterns")
        for pattern in self.session_patterns:
            if (
                not isinstance(pattern, str)
                or not pattern
                or not pattern.isascii()
                or not pattern.isprintable()
                or any(c.isspace() for c in pattern)
            ):
                raise ValueError("a session pattern must be a non-empty printable ASCII glob")
        for root in (self.transcript_root, self.artifact_root):
            if root is not None and (
                not isinstance(root, str) or "\x00" in root or not os.path.isabs(root)
            ):
                raise ValueError("a source root must be an absolute path")

    def root_for(self, pointer: Pointer) -> str | None:
        """The trusted root this policy gives the pointer's kind (``None``: not configured)."""
        if isinstance(pointer, TranscriptPointer):
            return self.transcript_root
        return self.artifact_root


def authorise(pointer: Pointer, policy: SourcePolicy) -> bool:
    """May this tenant follow ``pointer`` at all? Decided on values only, before any lookup."""
    if pointer.kind not in policy.allowed_kinds or policy.root_for(pointer) is None:
        return False
    return any(fnmatch.fnmatchcase(pointer.session, p) for p in policy.session_patterns)
