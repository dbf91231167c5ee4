"""Write a tool-result artifact as ``<root>/<session>/tool-results/<name>``; return its pointer.

Atomic: the bytes go to a temporary file in the same directory (``O_EXCL | O_NOFOLLOW``, named
``.<name>.<random>.tmp``: a leading dot can never be a pointer component, so a temporary file is
never addressable), are ``fsync``-ed, renamed over ``<name>`` and the directory is ``fsync``-ed.
Readers see the old bytes or the new ones, never a mix. Rewriting a name with other bytes is
allowed and makes earlier pointers to it resolve ``corrupt`` (their digest no longer matches),
which is the truth. Directories are created as needed and never entered through a symlink.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets

from proxy.core.pointers import (
    ArtifactPointer,
    format_pointer,
    is_valid_component,
    is_valid_session_id,
)
from proxy.sources.layout import TOOL_RESULTS_DIR, ensure_subdir, fsync_dir, open_root_for_writing

__all__ = ["write_artifact"]

_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC


def write_artifact(root: str, session: str, name: str, data: bytes) -> str:
    """Store ``data`` atomically; return ``artifact:<session>:<name>:<64-hex sha256>``."""
    if not is_valid_session_id(session):
        raise ValueError("invalid session id")
    if not is_valid_component(name):
        raise ValueError("invalid artifact name")
    if not isinstance(data, bytes):
        raise TypeError("artifact data must be bytes")
    pointer = ArtifactPointer(session, name, hashlib.sha256(data).hexdigest())
    fds: list[int] = []
    try:
        fds.append(open_root_for_writing(root))
        for part in (session, TOOL_RESULTS_DIR):
            fds.append(ensure_subdir(fds[-1], part))
        directory = fds[-1]
        temp = f".{name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(temp, _TEMP_FLAGS, 0o600, dir_fd=directory)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=directory)
            raise
        fsync_dir(directory)
    finally:
        for fd in reversed(fds):
            os.close(fd)
    return format_pointer(pointer)
