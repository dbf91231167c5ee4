"""Write a session's transcript as ``<root>/<session>.jsonl``, the layout the resolver verifies
(an agent's conversation: ``<root>/agents/<session>/<agent>.jsonl``).

The proxy itself writes the file only with :func:`export_session`: a projection of the store
(the record of truth) that carries the store's sequence numbers and byte form
(``transcript_records.record_bytes``), is idempotent (running it twice writes nothing the second
time) and repairs itself: a file deleted, truncated, cut mid-line by a crash, or ending in a line
that is not the store's event at that sequence is caught up or rebuilt from the store. Pointers
never depend on it (``pointer_resolver`` verifies transcripts against the store).
:func:`append_events` (numbering its own lines) is kept for tools and tests of the file layout.

One JSON object per line, in this key order::

    {"schema_version": 1, "sequence": 1, "recorded_at": "...", "session_id": "...",
     "event_id": "...", "type": "...", "role": "..." | null, "content": ...}

Append-only and crash-tolerant:

* the file is opened relative to the root's fd with ``O_NOFOLLOW`` (a symlink is refused) and must
  be a regular file; appends take an exclusive ``flock`` so concurrent writers (threads or
  processes) get contiguous, unique sequences;
* the next sequence follows the file's last complete record, which must belong to this session
  (otherwise nothing is written: ``ValueError``). Only the tail is read, not the whole file;
* a final line without its newline is the remains of a writer that died mid-append; readers never
  count it as a record, so it is truncated away before appending;
* all of a call's events are serialised first (a bad event writes nothing), written with one
  ``O_APPEND`` write, then ``fsync``-ed; a new file's directory entry is ``fsync``-ed too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson

from proxy.core.bounded import Bounded
from proxy.core.pointers import (
    MAX_SEQUENCE,
    TranscriptPointer,
    format_pointer,
    is_valid_agent_id,
    is_valid_session_id,
)
from proxy.sources.layout import (
    AGENTS_DIR,
    ensure_subdir,
    fsync_dir,
    open_root_for_writing,
    transcript_file_name,
)

__all__ = [
    "SCHEMA_VERSION",
    "ExportMarks",
    "StoredRecord",
    "TranscriptEvent",
    "append_events",
    "export_session",
]

SCHEMA_VERSION = 1
_WRITE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
_TAIL_BLOCK = 64 << 10


@dataclass(frozen=True, slots=True)
class TranscriptEvent:
    """One event to append; the writer assigns ``sequence`` and ``session_id``."""

    event_id: str
    type: str
    role: str | None
    content: object
    recorded_at: str  # ISO 8601, UTC, chosen by the caller (the writer reads no clock)

    def __post_init__(self) -> None:
        for name in ("event_id", "type", "recorded_at"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"TranscriptEvent.{name} must be a non-empty string")
        if self.role is not None and not isinstance(self.role, str):
            raise ValueError("TranscriptEvent.role must be a string or None")


def append_events(
    root: str,
    session: str,
    events: Sequence[TranscriptEvent],
    *,
    max_record_bytes: int = 1 << 20,
) -> tuple[str, ...]:
    """Append ``events`` to the session's transcript; return their ``transcript:`` pointers."""
    if not is_valid_session_id(session):
        raise ValueError("invalid session id")
    if not events:
        return ()
    root_fd = open_root_for_writing(root)
    try:
        fd = os.open(transcript_file_name(session), _WRITE_FLAGS, 0o600, dir_fd=root_fd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError("the transcript is not a regular file")
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            last = _last_sequence(fd, size, session, max_record_bytes)
            if last + len(events) > MAX_SEQUENCE:
                raise ValueError("transcript sequence space exhausted")
            lines = [
                _serialise(session, last + i, event, max_record_bytes)
                for i, event in enumerate(events, start=1)
            ]
            if lines:
                _write_all(fd, b"".join(lines))
                os.fsync(fd)
                if size == 0:
                    fsync_dir(root_fd)
        finally:
            os.close(fd)  # also releases the lock
    finally:
        os.close(root_fd)
    return tuple(
        format_pointer(TranscriptPointer(session, last + i)) for i in range(1, len(events) + 1)
    )


def _serialise(session: str, sequence: int, event: TranscriptEvent, limit: int) -> bytes:
    record = {
        "schema_version": SCHEMA_VERSION,
        "sequence": sequence,
        "recorded_at": event.recorded_at,
        "session_id": session,
        "event_id": event.event_id,
        "type": event.type,
        "role": event.role,
        "content": event.content,
    }
    line = orjson.dumps(record)  # compact: never a raw newline inside
    if len(line) > limit:
        raise ValueError("transcript event exceeds the record size bound")
    return line + b"\n"


def _last_sequence(fd: int, size: int, session: str, limit: int) -> int:
    """The sequence of the last complete record (0 if none); drops a partial final line."""
    pos = size
    data = b""
    while True:
        end = data.rfind(b"\n")
        if end >= 0:
            previous = data.rfind(b"\n", 0, end)
            if previous >= 0 or pos == 0:
                complete_end = pos + end + 1
                line = data[previous + 1 : end]
                break
        elif pos == 0:
            complete_end, line = 0, b""
            break
        if size - pos > 2 * limit + 2:
            raise ValueError("the transcript's last record exceeds the record size bound")
        step = min(_TAIL_BLOCK, pos)
        pos -= step
        data = os.pread(fd, step, pos) + data
    if complete_end < size:
        os.ftruncate(fd, complete_end)
    if complete_end == 0:
        return 0
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        record = None
    sequence = record.get("sequence") if isinstance(record, dict) else None
    if (
        not isinstance(record, dict)
        or record.get("session_id") != session
        or type(sequence) is not int
        or not 1 <= sequence <= MAX_SEQUENCE
    ):
        raise ValueError("the existing transcript does not end with a record of this session")
    return sequence


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


# -- the store's projection ----------------------------------------------------------------------

_EXPORT_PAGE = 200
_MAX_TAIL_BYTES = 256 << 20  # a last line longer than this is not read back: the file is rebuilt
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """One event as the store holds it: its sequence number, id and record bytes."""

    seq: int
    event_id: str
    line: bytes  # ``record_bytes``: no newline


Fetch = Callable[[int, int], Sequence[StoredRecord]]
"""``fetch(after_seq, limit)``: the store's events after ``after_seq``, in order (blocking)."""


Mark = tuple[int, int, int, int]
MARK_BYTES = 680  # one file's mark: its (root, session) key and four ints (tests/test_bounded_caches.py)


class ExportMarks:
    """Where each exported file was left by this process: ``(st_ino, size, st_mtime_ns, lines)``
    per ``(root, session)``: a file as it was left is not checked again, and the line count only
    reads what others appended since. Bounded (``transcript_exports`` in the metrics): a file
    whose mark was pushed out costs its next export a read of its last line back from the store
    and a count of its lines. Shared by the export threads (one lock)."""

    def __init__(self, max_files: int = 4096) -> None:
        self.files: Bounded[tuple[str, str], Mark] = Bounded(
            "transcript_exports", max_files, entry_bytes=MARK_BYTES, idle_forget=True
        )
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> Mark | None:
        with self._lock:
            return self.files.get(key)

    def put(self, key: tuple[str, str], mark: Mark) -> None:
        with self._lock:
            self.files.put(key, mark)

    def pop(self, key: tuple[str, str]) -> None:
        with self._lock:
            self.files.pop(key)

    def forget_idle(self, now: float, idle: float) -> int:
        """Forget the marks of files not exported to for ``idle`` seconds."""
        with self._lock:
            return self.files.forget_idle(now, idle)


def export_session(
    root: str,
    session: str,
    fetch: Fetch,
    marks: ExportMarks | None = None,
    agent: str = "",
) -> int:
    """Bring ``<root>/<session>.jsonl`` level with the store; return its last sequence number.
    With ``agent``: that agent's conversation, ``<root>/agents/<session>/<agent>.jsonl`` (no
    session id contains ``/``, so ``agents/`` is never a session's file).

    Under the file's ``flock``: a partial final line is cut; the file must hold as many lines as
    its last line's sequence number and that line must be, byte for byte, the store's record at
    that sequence (else the whole file is rebuilt from the store into a temporary file renamed
    over it); then the store's later records are appended. Lines before the last are counted,
    not compared: a file edited in the middle keeps its edit until it is rebuilt.
    """
    marks = marks if marks is not None else ExportMarks()
    if not is_valid_session_id(session):
        raise ValueError("invalid session id")
    if agent and not is_valid_agent_id(agent):
        raise ValueError("invalid agent id")
    top_fd = open_root_for_writing(root)
    root_fd = top_fd
    where = session
    try:
        if agent:
            agents_fd = ensure_subdir(top_fd, AGENTS_DIR)
            try:
                root_fd = ensure_subdir(agents_fd, session)
            finally:
                os.close(agents_fd)
            where = f"{session}/{agent}"
        return _export(root, root_fd, where, transcript_file_name(agent or session), fetch, marks)
    finally:
        if root_fd != top_fd:
            os.close(root_fd)
        os.close(top_fd)


def _export(
    root: str, root_fd: int, where: str, name: str, fetch: Fetch, marks: ExportMarks
) -> int:
    """``export_session`` of the file ``name`` in the folder ``root_fd`` (``where``: the
    session, or ``<session>/<agent>``, the key of its marks)."""
    key = (root, where)
    fd = os.open(name, _WRITE_FLAGS, 0o600, dir_fd=root_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("the transcript is not a regular file")
        fcntl.flock(fd, fcntl.LOCK_EX)
        st = os.fstat(fd)
        size = st.st_size
        left = marks.get(key)
        if left is not None and left[:3] == (st.st_ino, size, st.st_mtime_ns):
            last: int | None = left[3]  # as this process left it: nobody wrote since
        else:
            last = _consistent_tail(fd, size, fetch)
            if last is not None and _line_count(fd, st, marks, key) != last:
                last = None
        if last is None:
            marks.pop(key)
            return _rebuild(root_fd, name, fetch)
        written = False
        while True:
            page = fetch(last, _EXPORT_PAGE)
            if not page:
                break
            _write_all(fd, b"".join(r.line + b"\n" for r in page))
            last = page[-1].seq
            written = True
            if len(page) < _EXPORT_PAGE:
                break  # the store's end
        if written:
            os.fsync(fd)
            if size == 0:
                fsync_dir(root_fd)
        now = os.fstat(fd)
        marks.put(key, (now.st_ino, now.st_size, now.st_mtime_ns, last))
        return last
    finally:
        os.close(fd)


def _consistent_tail(fd: int, size: int, fetch: Fetch) -> int | None:
    """The last sequence of a file that agrees with the store (0 if empty); ``None``: rebuild."""
    pos, data = size, b""
    while True:
        end = data.rfind(b"\n")
        if end >= 0:
            previous = data.rfind(b"\n", 0, end)
            if previous >= 0 or pos == 0:
                complete_end, line = pos + end + 1, data[previous + 1 : end]
                break
        elif pos == 0:
            complete_end, line = 0, b""
            break
        if size - pos > _MAX_TAIL_BYTES:
            return None
        step = min(_TAIL_BLOCK, pos)
        pos -= step
        data = os.pread(fd, step, pos) + data
    if complete_end < size:
        os.ftruncate(fd, complete_end)  # the remains of an interrupted append
    if complete_end == 0:
        return 0
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    sequence = record.get("sequence") if isinstance(record, dict) else None
    if type(sequence) is not int or not 1 <= sequence <= MAX_SEQUENCE:
        return None
    stored = fetch(sequence - 1, 1)
    if not stored or stored[0].seq != sequence or stored[0].line != line:
        return None
    return sequence


def _line_count(fd: int, st: os.stat_result, marks: ExportMarks, key: tuple[str, str]) -> int:
    """Complete lines in the file (read only past where this process left it, if it did)."""
    size = os.fstat(fd).st_size  # after a partial last line was cut
    known = marks.get(key)
    start, count = 0, 0
    if known is not None and known[0] == st.st_ino and known[1] <= size:
        start, count = known[1], known[3]
    pos = start
    while pos < size:
        chunk = os.pread(fd, min(1 << 20, size - pos), pos)
        if not chunk:
            break
        count += chunk.count(b"\n")
        pos += len(chunk)
    return count


def _rebuild(root_fd: int, name: str, fetch: Fetch) -> int:
    temp = f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(temp, _TEMP_FLAGS, 0o600, dir_fd=root_fd)
    last = 0
    try:
        try:
            while True:
                page = fetch(last, _EXPORT_PAGE)
                if not page:
                    break
                _write_all(fd, b"".join(r.line + b"\n" for r in page))
                last = page[-1].seq
                if len(page) < _EXPORT_PAGE:
                    break
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=root_fd, dst_dir_fd=root_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=root_fd)
        raise
    fsync_dir(root_fd)
    return last
