"""Where sources live under a tenant's trusted roots, and the no-follow directory primitives.

Layout (every name below a root is a pointer component, so it has been through the grammar)::

    <transcript_root>/<session>.jsonl                     one JSON event per line
    <transcript_root>/agents/<session>/<agent>.jsonl      an agent's conversation, the same
    <artifact_root>/<session>/tool-results/<name>         the artifact's bytes

Nothing below a root is ever reached through a symlink: directories are opened one component at a
time relative to their parent's fd with ``O_NOFOLLOW``. The root path itself is configuration and
is trusted as written (it may contain symlinks, e.g. ``/var/lib`` on some systems).

Error messages raised here never contain a path or a component.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from proxy.core.pointers import Pointer, TranscriptPointer

__all__ = [
    "AGENTS_DIR",
    "DIR_FLAGS",
    "FILE_FLAGS",
    "ROOT_FLAGS",
    "TOOL_RESULTS_DIR",
    "TRANSCRIPT_SUFFIX",
    "ensure_subdir",
    "fsync_dir",
    "locate",
    "open_root_for_writing",
    "transcript_file_name",
]

TOOL_RESULTS_DIR = "tool-results"
AGENTS_DIR = "agents"
TRANSCRIPT_SUFFIX = ".jsonl"

ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO must not block; O_NOCTTY: a terminal never becomes ours.
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def transcript_file_name(session: str) -> str:
    return session + TRANSCRIPT_SUFFIX


def locate(pointer: Pointer) -> tuple[tuple[str, ...], str]:
    """The directories to walk below the root, then the file name, for ``pointer``."""
    if isinstance(pointer, TranscriptPointer):
        return (), transcript_file_name(pointer.session)
    return (pointer.session, TOOL_RESULTS_DIR), pointer.name


def open_root_for_writing(root: str) -> int:
    """Create the root if needed (it is trusted configuration) and open it as a directory."""
    if not os.path.isabs(root):
        raise ValueError("a source root must be an absolute path")
    os.makedirs(root, mode=0o700, exist_ok=True)
    return os.open(root, ROOT_FLAGS)


def ensure_subdir(parent_fd: int, name: str) -> int:
    """Open (creating if absent) the directory ``name`` under ``parent_fd``, never via a symlink."""
    with contextlib.suppress(FileExistsError):  # existing is fine: it is checked below
        os.mkdir(name, mode=0o700, dir_fd=parent_fd)
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
            what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
            raise NotADirectoryError(
                exc.errno, f"refusing a source directory that is {what}"
            ) from None
        raise


def fsync_dir(fd: int) -> None:
    """Make a directory entry change (create, rename) durable."""
    os.fsync(fd)
