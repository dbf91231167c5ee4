"""The store's own errors: what every backend raises, whatever the database underneath::

    StoreError                  base; messages never hold a path, a URL or content
    ├── StoreUnavailable        the database cannot be opened, read or written (I/O, a lost or
    │   │                       refused connection, closed store); the edge answers 503 /
    │   │                       renders the "store unavailable" block
    │   └── StoreBusy           a lock (a session's row) still held by another writer after the
    │                           busy timeout: the database answered (``health`` counts it as up)
    ├── SchemaTooNew            the database was migrated by a newer release (``found`` /
    │                           ``supported``: its schema, ours); nothing was changed
    ├── PrefixConflict          append_transcript(expected_prefix=...) found another prefix
    ├── DuplicateEvent          an event_id already recorded in the session
    └── ManifestConflict        a different manifest already stored under the compaction id
    InvalidWrite (ValueError)   from proxy.core.durable: field-named errors, nothing written (422)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.store.values import Prefix

__all__ = [
    "DuplicateEvent",
    "ManifestConflict",
    "PrefixConflict",
    "SchemaTooNew",
    "StoreBusy",
    "StoreError",
    "StoreUnavailable",
]


class StoreError(Exception):
    """Base of the store's own errors. Messages never contain paths, URLs or content."""


class StoreUnavailable(StoreError):
    pass


class StoreBusy(StoreUnavailable):
    pass


class PrefixConflict(StoreError):
    def __init__(self, current: Prefix) -> None:
        super().__init__("the session's recorded prefix changed")
        self.current = current


class DuplicateEvent(StoreError):
    pass


class ManifestConflict(StoreError):
    pass


class SchemaTooNew(StoreError):
    """The database was migrated by a newer release; this one refuses to use it (and changes
    nothing). ``found``: the newest migration recorded in it; ``supported``: the newest this
    release knows; ``unknown``: the recorded versions this release does not know (or knows under
    another name)."""

    def __init__(self, found: int, supported: int, unknown: tuple[int, ...]) -> None:
        super().__init__(
            f"the store's schema is version {found}, this release supports up to version"
            f" {supported}: it has migrations this release does not know"
            f" ({', '.join(map(str, unknown))})"
        )
        self.found = found
        self.supported = supported
        self.unknown = unknown
