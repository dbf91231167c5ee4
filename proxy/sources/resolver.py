"""Resolve source pointers against a tenant's trusted roots: the filesystem edge of pointers.

Order of decisions for one pointer (each step only runs if the previous one passed)::

    parse_pointer        corrupt / unsupported              no I/O
    authorise(policy)    denied                             no I/O
    walk from the root   missing / denied / corrupt         dir fds, O_NOFOLLOW, no reads
    fstat + cache        (cached result)                    no reads
    verify               available / corrupt / missing      bounded reads

Walk. The root (trusted configuration) is opened as a directory; every component below it is
opened relative to its parent's fd with ``O_DIRECTORY | O_NOFOLLOW``; the final name is first
``lstat``-ed (so a FIFO or device is never opened) and then opened with ``O_NOFOLLOW | O_NONBLOCK``
and ``fstat``-ed. Mapping:

* a name that does not exist, at any depth (ENOENT)                       -> ``missing``
* a symlink anywhere below the root, wherever it points (ELOOP, lstat)      -> ``denied``
* permission refused by the OS (EACCES, EPERM)                            -> ``denied``
* a non-directory where the layout has a directory, or a directory, FIFO,
  socket or device where it has a file                                    -> ``corrupt``
* resource errors (EMFILE, ENOMEM, ...) are not a property of the source: they propagate as
  ``OSError`` and nothing is cached.

Tenants have their own roots, so another tenant's source is simply absent under this tenant's
root: ``Resolution("missing", None)``, the same value as for a pointer that names nothing.

Transcripts (``<root>/<session>.jsonl``). The proxy itself verifies transcript pointers against
the store (``proxy.sources.pointer_resolver``); this checks the JSONL export's layout, whose line
``k`` is the store's event ``k`` byte for byte once the export is level. Records 1..seq are read in order (bounded: each record
at most ``max_record_bytes``, at most ``max_transcript_scan_bytes`` read in total) and each must be
UTF-8, a JSON object, with ``session_id`` equal to the pointer's session, ``sequence`` an integer
equal to its line number (contiguous from 1) and ``event_id`` a non-empty string. A blank line is a
bad record. ``schema_version`` and the other fields are not checked (forward compatibility).
Decisions:

* lines *after* the pointed record are never read: a bad or missing later line is irrelevant;
* a final line without its ``\\n`` is not a record yet (a writer may be mid-append): a pointer to
  it is ``missing`` until the newline lands; a file that ends before record seq is ``missing``;
* the evidence is the SHA-256 of the pointed record's exact bytes, the line without its ``\\n``;
* a record over the size bound, or a pointed record beyond the scan bound, is ``corrupt``
  (it cannot be verified within bounds).

Artifacts (``<root>/<session>/tool-results/<name>``). The file is hashed with SHA-256 in bounded
chunks (at most ``max_artifact_bytes``, else ``corrupt``); the pointer's 12- or 64-hex digest must
be a prefix of the hex digest, else ``corrupt``. The evidence is the full hex digest.

Excerpts (admin API only, ``excerpt=True``): for an ``available`` source, the first
``max_excerpt_chars`` characters of the record / artifact text, decoded as UTF-8 without ever
splitting a character (invalid bytes become U+FFFD). Every other outcome has no excerpt.

Cache. A result that depended on file content is cached under (policy, pointer, excerpt,
st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns) of the open file, in a bounded LRU; a warm
resolve still walks and ``fstat``-s (so deletions, renames and symlink swaps are seen at once) but
does not read or hash. ``st_ctime_ns`` is included because ``utime`` can put an mtime back but
cannot put a ctime back. A result is stored only if the file's identity did not change while it
was read. Transcripts being appended to change size on every append and so are re-verified.

Hard links are not detected: a hard link inside a root to a file elsewhere on the same filesystem
is a regular file like any other. Making one needs write access to the root (and, with
``fs.protected_hardlinks``, ownership of the target), i.e. the root is already not trusted.

Results never contain filesystem paths. ``SourceResolver`` is safe to share between threads.
"""

from __future__ import annotations

import codecs
import errno
import hashlib
import os
import stat
import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Literal

import orjson

from proxy.core.bounded import Bounded
from proxy.core.pointers import (
    ArtifactPointer,
    BadPointer,
    Pointer,
    TranscriptPointer,
    parse_pointer,
)
from proxy.sources.layout import DIR_FLAGS, FILE_FLAGS, ROOT_FLAGS, locate
from proxy.sources.policy import SourcePolicy, authorise

__all__ = [
    "Opener",
    "Resolution",
    "ResolverLimits",
    "SourceResolver",
    "Status",
    "default_opener",
]

Status = Literal["available", "missing", "denied", "corrupt", "unsupported"]
STATUSES: frozenset[str] = frozenset({"available", "missing", "denied", "corrupt", "unsupported"})


@dataclass(frozen=True, slots=True)
class Resolution:
    """What a pointer resolved to. Never a path; ``excerpt`` only when asked and available."""

    status: Status
    evidence_sha256: str | None
    excerpt: str | None = None


@dataclass(frozen=True, slots=True)
class ResolverLimits:
    max_record_bytes: int = 1 << 20
    max_transcript_scan_bytes: int = 64 << 20
    transcript_chunk_bytes: int = 64 << 10
    max_artifact_bytes: int = 1 << 30
    artifact_chunk_bytes: int = 1 << 20
    max_excerpt_chars: int = 2000
    cache_entries: int = 4096

    def __post_init__(self) -> None:
        for name in self.__slots__:
            if getattr(self, name) < (0 if name == "cache_entries" else 1):
                raise ValueError(f"ResolverLimits.{name} must be positive")


# Memory one verified pointer takes (measured: tests/test_bounded_caches.py): its key (the policy,
# the pointer, the file's identity) and the Resolution, its excerpt up to max_excerpt_chars.
CHECK_BYTES = 3800


Opener = Callable[[str, int, int | None], int]
"""``opener(name, flags, dir_fd) -> fd``: how the resolver opens things (tests audit it)."""


def default_opener(name: str, flags: int, dir_fd: int | None) -> int:
    return os.open(name, flags, dir_fd=dir_fd)


_MISSING = Resolution("missing", None)
_DENIED = Resolution("denied", None)
_CORRUPT = Resolution("corrupt", None)
_BY_STATUS: dict[str, Resolution] = {
    "missing": _MISSING,
    "denied": _DENIED,
    "corrupt": _CORRUPT,
    "unsupported": Resolution("unsupported", None),
}

_ERRNO_STATUS: dict[int, Status] = {
    errno.ENOENT: "missing",
    errno.ENOTDIR: "missing",  # only from the root path (trusted config): nothing is there
    errno.ELOOP: "denied",
    errno.EACCES: "denied",
    errno.EPERM: "denied",
    errno.ENXIO: "corrupt",  # a socket
    errno.ENODEV: "corrupt",
    errno.EISDIR: "corrupt",
    errno.EOVERFLOW: "corrupt",
    errno.ETXTBSY: "corrupt",
    errno.EAGAIN: "corrupt",
    errno.ENAMETOOLONG: "corrupt",
    errno.EIO: "corrupt",
}


def _status_of(exc: OSError) -> Status:
    status = _ERRNO_STATUS.get(exc.errno or 0)
    if status is None:
        raise exc
    return status


_Identity = tuple[int, int, int, int, int]


def _identity(st: os.stat_result) -> _Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _Walk:
    """Directory fds opened for one ``resolve``/``resolve_many`` call; closed by :meth:`close`."""

    __slots__ = ("_dirs", "_opener")

    def __init__(self, opener: Opener) -> None:
        self._opener = opener
        self._dirs: dict[tuple[str, ...], int | Status] = {}

    def close(self) -> None:
        for fd in self._dirs.values():
            if isinstance(fd, int):
                os.close(fd)
        self._dirs.clear()

    def directory(self, root: str, parts: tuple[str, ...]) -> int | Status:
        key = (root, *parts)
        found = self._dirs.get(key)
        if found is not None:
            return found
        if not parts:
            result = self._open_root(root)
        else:
            parent = self.directory(root, parts[:-1])
            result = parent if isinstance(parent, str) else self._open_subdir(parent, parts[-1])
        self._dirs[key] = result
        return result

    def _open_root(self, root: str) -> int | Status:
        try:
            return self._opener(root, ROOT_FLAGS, None)
        except OSError as exc:
            return _status_of(exc)

    def _open_subdir(self, parent: int, name: str) -> int | Status:
        try:
            return self._opener(name, DIR_FLAGS, parent)
        except OSError as exc:
            if exc.errno != errno.ENOTDIR:
                return _status_of(exc)
        # O_DIRECTORY | O_NOFOLLOW on a symlink fails with ENOTDIR, as on a file: tell them apart.
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError as exc:
            return _status_of(exc)
        return "denied" if stat.S_ISLNK(st.st_mode) else "corrupt"

    def open_file(self, parent: int, name: str) -> tuple[int, os.stat_result] | Status:
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError as exc:
            return _status_of(exc)
        if stat.S_ISLNK(st.st_mode):
            return "denied"
        if not stat.S_ISREG(st.st_mode):
            return "corrupt"
        try:
            fd = self._opener(name, FILE_FLAGS, parent)
        except OSError as exc:
            return _status_of(exc)
        try:
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        if not stat.S_ISREG(st.st_mode):  # swapped between lstat and open
            os.close(fd)
            return "corrupt"
        return fd, st


def _excerpt_of(data: bytes, max_chars: int) -> str:
    # final=False holds back a trailing partial character instead of mangling it.
    return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)[:max_chars]


def _record_ok(line: bytes, session: str, expected: int) -> bool:
    try:
        line.decode("utf-8")
        record = orjson.loads(line)
    except (UnicodeDecodeError, orjson.JSONDecodeError):
        return False
    if not isinstance(record, dict):
        return False
    sequence = record.get("sequence")
    event_id = record.get("event_id")
    return (
        record.get("session_id") == session
        and type(sequence) is int
        and sequence == expected
        and isinstance(event_id, str)
        and event_id != ""
    )


def _verify_transcript(
    fd: int,
    pointer: TranscriptPointer,
    limits: ResolverLimits,
    excerpt: bool,
    sink: list[bytes] | None = None,
) -> Resolution:
    buf = b""
    start = 0  # first byte of the current (not yet complete) record in buf
    search = 0  # where to look for the next newline
    scanned = 0
    expected = 1
    while True:
        newline = buf.find(b"\n", search)
        if newline < 0:
            if len(buf) - start > limits.max_record_bytes:
                return _CORRUPT
            if scanned >= limits.max_transcript_scan_bytes:
                return _CORRUPT
            try:
                chunk = os.read(
                    fd,
                    min(limits.transcript_chunk_bytes, limits.max_transcript_scan_bytes - scanned),
                )
            except OSError as exc:
                return _BY_STATUS[_status_of(exc)]
            if not chunk:
                return _MISSING  # ends before record `sequence` (a partial last line is not one)
            scanned += len(chunk)
            buf = buf[start:] + chunk
            search = len(buf) - len(chunk)
            start = 0
            continue
        line = buf[start:newline]
        start = search = newline + 1
        if len(line) > limits.max_record_bytes or not _record_ok(line, pointer.session, expected):
            return _CORRUPT
        if expected == pointer.sequence:
            if sink is not None:
                sink.append(line)
            text = _excerpt_of(line, limits.max_excerpt_chars) if excerpt else None
            return Resolution("available", hashlib.sha256(line).hexdigest(), text)
        expected += 1


def _verify_artifact(
    fd: int,
    size: int,
    pointer: ArtifactPointer,
    limits: ResolverLimits,
    excerpt: bool,
    sink: list[bytes] | None = None,
) -> Resolution:
    if size > limits.max_artifact_bytes:
        return _CORRUPT
    digest = hashlib.sha256()
    want = 4 * limits.max_excerpt_chars if excerpt else 0
    head = b""
    total = 0
    while True:
        try:
            chunk = os.read(fd, limits.artifact_chunk_bytes)
        except OSError as exc:
            return _BY_STATUS[_status_of(exc)]
        if not chunk:
            break
        total += len(chunk)
        if total > limits.max_artifact_bytes:
            return _CORRUPT
        digest.update(chunk)
        if sink is not None:
            sink.append(chunk)
        if len(head) < want:
            head += chunk[: want - len(head)]
    hexdigest = digest.hexdigest()
    if not hexdigest.startswith(pointer.digest):
        if sink is not None:
            sink.clear()
        return _CORRUPT
    text = _excerpt_of(head, limits.max_excerpt_chars) if excerpt else None
    return Resolution("available", hexdigest, text)


class SourceResolver:
    """Resolves pointer text for a tenant's :class:`SourcePolicy`; shared, thread-safe."""

    def __init__(
        self, limits: ResolverLimits | None = None, *, opener: Opener = default_opener
    ) -> None:
        self.limits = limits or ResolverLimits()
        self._opener = opener
        self._lock = threading.Lock()
        # bounded (``source_checks`` in the metrics): a miss reads and hashes the file again
        self.cache: Bounded[Hashable, Resolution] = Bounded(
            "source_checks", self.limits.cache_entries, entry_bytes=CHECK_BYTES
        )
        self._hits = 0
        self._misses = 0

    @property
    def hits(self) -> int:
        return self._hits

    @property
    def misses(self) -> int:
        return self._misses

    @property
    def cache_len(self) -> int:
        return len(self.cache)

    def clear_cache(self) -> None:
        with self._lock:
            self.cache.clear()

    def resolve(
        self, pointer_text: object, policy: SourcePolicy, *, excerpt: bool = False
    ) -> Resolution:
        walk = _Walk(self._opener)
        try:
            return self._resolve(pointer_text, policy, excerpt, walk)
        finally:
            walk.close()

    def resolve_many(
        self, pointer_texts: Iterable[object], policy: SourcePolicy, *, excerpt: bool = False
    ) -> tuple[Resolution, ...]:
        """Resolve in order, sharing directory fds (and duplicate pointers) within the batch."""
        walk = _Walk(self._opener)
        seen: dict[str, Resolution] = {}
        out: list[Resolution] = []
        try:
            for text in pointer_texts:
                if isinstance(text, str) and text in seen:
                    out.append(seen[text])
                    continue
                result = self._resolve(text, policy, excerpt, walk)
                if isinstance(text, str):
                    seen[text] = result
                out.append(result)
        finally:
            walk.close()
        return tuple(out)

    def _resolve(
        self, pointer_text: object, policy: SourcePolicy, excerpt: bool, walk: _Walk
    ) -> Resolution:
        pointer = parse_pointer(pointer_text)
        if isinstance(pointer, BadPointer):
            return _BY_STATUS[pointer.status]
        if not authorise(pointer, policy):
            return _DENIED
        root = policy.root_for(pointer)
        if root is None:  # authorise() already refused this; kept for the type checker
            return _DENIED
        parts, name = locate(pointer)
        directory = walk.directory(root, parts)
        if isinstance(directory, str):
            return _BY_STATUS[directory]
        opened = walk.open_file(directory, name)
        if isinstance(opened, str):
            return _BY_STATUS[opened]
        fd, st = opened
        try:
            key = (policy, pointer, excerpt, *_identity(st))
            with self._lock:
                cached = self.cache.get(key)
                if cached is not None:
                    self._hits += 1
                    return cached
                self._misses += 1
            result = self._verify(fd, st, pointer, excerpt)
            if _identity(os.fstat(fd)) == _identity(st):
                self._remember(key, result)
            return result
        finally:
            os.close(fd)

    def read(
        self, pointer_text: object, policy: SourcePolicy, *, max_bytes: int | None = None
    ) -> tuple[Resolution, bytes | None]:
        """The pointed source itself, after the very checks ``resolve`` makes (parse, authorise,
        no-follow walk, verification): a transcript record's line (without its newline) or an
        artifact's whole content; ``None`` with any status but ``available``. Never cached.
        An artifact over ``max_bytes`` (default ``max_artifact_bytes``) is ``corrupt``."""
        pointer = parse_pointer(pointer_text)
        if isinstance(pointer, BadPointer):
            return _BY_STATUS[pointer.status], None
        if not authorise(pointer, policy):
            return _DENIED, None
        root = policy.root_for(pointer)
        if root is None:
            return _DENIED, None
        walk = _Walk(self._opener)
        try:
            parts, name = locate(pointer)
            directory = walk.directory(root, parts)
            if isinstance(directory, str):
                return _BY_STATUS[directory], None
            opened = walk.open_file(directory, name)
            if isinstance(opened, str):
                return _BY_STATUS[opened], None
            fd, st = opened
            try:
                sink: list[bytes] = []
                if isinstance(pointer, TranscriptPointer):
                    result = _verify_transcript(fd, pointer, self.limits, False, sink)
                else:
                    limit = min(max_bytes or self.limits.max_artifact_bytes, self.limits.max_artifact_bytes)
                    if st.st_size > limit:
                        return _CORRUPT, None
                    result = _verify_artifact(fd, st.st_size, pointer, self.limits, False, sink)
            finally:
                os.close(fd)
        finally:
            walk.close()
        if result.status != "available":
            return result, None
        return result, b"".join(sink)

    def _verify(self, fd: int, st: os.stat_result, pointer: Pointer, excerpt: bool) -> Resolution:
        if isinstance(pointer, TranscriptPointer):
            return _verify_transcript(fd, pointer, self.limits, excerpt)
        return _verify_artifact(fd, st.st_size, pointer, self.limits, excerpt)

    def _remember(self, key: Hashable, result: Resolution) -> None:
        with self._lock:
            self.cache.put(key, result)
