"""Real source trees for two tenants, and an auditing opener for the resolver."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy.sources.artifact_files import write_artifact
from proxy.sources.policy import SourcePolicy
from proxy.sources.transcript_files import TranscriptEvent, append_events

BOTH = frozenset({"transcript", "artifact"})
A_TXT = b"hello from a tool\n"
A_TXT_SHA = hashlib.sha256(A_TXT).hexdigest()
OUTSIDE_BYTES = b"outside the root: must never be read\n"
B_SECRET = b"tenant b's secret\n"


def event(i: int, *, content: object = None) -> TranscriptEvent:
    return TranscriptEvent(
        event_id=f"evt-{i}",
        type="message",
        role="user" if i % 2 else "assistant",
        content=content if content is not None else [{"type": "text", "text": f"turn {i}"}],
        recorded_at=f"2025-01-01T00:00:{i % 60:02d}Z",
    )


@dataclass(frozen=True)
class Tenant:
    base: Path
    transcripts: Path
    artifacts: Path
    policy: SourcePolicy

    def transcript(self, session: str) -> Path:
        return self.transcripts / f"{session}.jsonl"

    def artifact(self, session: str, name: str) -> Path:
        return self.artifacts / session / "tool-results" / name

    def lines(self, session: str) -> list[bytes]:
        return self.transcript(session).read_bytes().split(b"\n")[:-1]


def make_tenant(base: Path, patterns: tuple[str, ...]) -> Tenant:
    transcripts, artifacts = base / "transcripts", base / "artifacts"
    transcripts.mkdir(parents=True)
    artifacts.mkdir(parents=True)
    policy = SourcePolicy(BOTH, patterns, str(transcripts), str(artifacts))
    return Tenant(base, transcripts, artifacts, policy)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the roots holding things no pointer may ever reach."""
    out = tmp_path / "outside"
    (out / "tool-results").mkdir(parents=True)
    (out / "secret.txt").write_bytes(OUTSIDE_BYTES)
    (out / "tool-results" / "a.txt").write_bytes(A_TXT)  # same name and bytes as inside
    append_events(str(out), "s1", [event(i) for i in range(1, 6)])  # a valid s1 transcript
    return out


@pytest.fixture
def tenant_a(tmp_path: Path, outside: Path) -> Tenant:
    """Tenant A: sessions ``s*``; s1 has a 5-event transcript, ``a.txt`` and an outward symlink."""
    t = make_tenant(tmp_path / "tenant-a", ("s*",))
    append_events(str(t.transcripts), "s1", [event(i) for i in range(1, 6)])
    write_artifact(str(t.artifacts), "s1", "a.txt", A_TXT)
    os.symlink(outside / "secret.txt", t.artifact("s1", "link-to-outside"))
    return t


@pytest.fixture
def tenant_b(tmp_path: Path) -> Tenant:
    """Tenant B: its own roots; session ``s9`` (which A's patterns also match) has sources."""
    t = make_tenant(tmp_path / "tenant-b", ("s*", "OTHER_TENANT_SESSION"))
    append_events(str(t.transcripts), "s9", [event(1), event(2)])
    append_events(str(t.transcripts), "OTHER_TENANT_SESSION", [event(1)])
    write_artifact(str(t.artifacts), "s9", "b.txt", B_SECRET)
    write_artifact(str(t.artifacts), "OTHER_TENANT_SESSION", "a.txt", A_TXT)
    return t


class AuditOpener:
    """Opens like the resolver would, recording where every open happened (by fd realpath)."""

    def __init__(self) -> None:
        self.attempts: list[tuple[str | None, str]] = []  # (realpath of dir_fd, name)
        self.opened: list[str] = []  # realpath of every fd handed out

    def __call__(self, name: str, flags: int, dir_fd: int | None) -> int:
        base = None if dir_fd is None else os.readlink(f"/proc/self/fd/{dir_fd}")
        self.attempts.append((base, name))
        fd = os.open(name, flags, dir_fd=dir_fd)
        self.opened.append(os.readlink(f"/proc/self/fd/{fd}"))
        return fd

    def assert_inside(self, *roots: str) -> None:
        real_roots = [os.path.realpath(r) for r in roots]

        def inside(path: str) -> bool:
            return any(path == r or path.startswith(r + os.sep) for r in real_roots)

        for base, name in self.attempts:
            if base is None:
                assert os.path.realpath(name) in real_roots, (
                    "opened a root that is not the tenant's"
                )
            else:
                assert inside(base), f"walked from {base!r}"
                assert "/" not in name and name not in (".", ".."), f"opened {name!r}"
        for path in self.opened:
            assert inside(path), f"opened {path!r} outside the tenant's roots"


def fifty_pointers(tenant: Tenant) -> list[str]:
    """25 transcript events and 25 artifacts, in 5 sessions."""
    pointers: list[str] = []
    for s in range(5):
        session = f"sess{s}"
        pointers += append_events(str(tenant.transcripts), session, [event(i) for i in range(1, 6)])
        for k in range(5):
            data = f"tool result {s}/{k}\n".encode() * 200
            pointers.append(write_artifact(str(tenant.artifacts), session, f"r{k}.txt", data))
    assert len(pointers) == 50
    return pointers
