"""Writing the source layout: transcripts (append-only JSONL) and artifacts (atomic)."""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest

from proxy.core.pointers import parse_pointer
from proxy.sources.artifact_files import write_artifact
from proxy.sources.policy import SourcePolicy
from proxy.sources.resolver import Resolution, SourceResolver
from proxy.sources.transcript_files import TranscriptEvent, append_events
from tests.shared_data import CC_TRANSCRIPT
from tests.sources.conftest import BOTH, event

CC = CC_TRANSCRIPT
if not CC.is_file():
    CC = (
        Path(__file__).resolve().parents[3]
        / "shared/data/transcripts/cc_mclaude_3af9b1a7_with_autocompact_full.json"
    )


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def policy_for(tmp_path: Path) -> SourcePolicy:
    return SourcePolicy(BOTH, ("*",), str(tmp_path / "t"), str(tmp_path / "a"))


# ---------------------------------------------------------------------------- transcripts


def test_records_have_the_schema_in_order(tmp_path: Path) -> None:
    root = tmp_path / "t"
    pointers = append_events(str(root), "s1", [event(1), event(2)])
    assert pointers == ("transcript:s1:1", "transcript:s1:2")
    lines = (root / "s1.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 3
    first = orjson.loads(lines[0])
    assert list(first) == [
        "schema_version",
        "sequence",
        "recorded_at",
        "session_id",
        "event_id",
        "type",
        "role",
        "content",
    ]
    assert first["schema_version"] == 1 and first["sequence"] == 1
    assert first["session_id"] == "s1" and first["event_id"] == "evt-1"
    assert (root / "s1.jsonl").stat().st_mode & 0o777 == 0o600


def test_sequences_continue_across_calls(tmp_path: Path) -> None:
    root = str(tmp_path / "t")
    assert append_events(root, "s1", [event(1)]) == ("transcript:s1:1",)
    assert append_events(root, "s1", []) == ()
    assert append_events(root, "s1", [event(2), event(3)]) == ("transcript:s1:2", "transcript:s1:3")
    assert append_events(root, "s2", [event(1)]) == ("transcript:s2:1",)
    r = SourceResolver()
    for p in ("transcript:s1:3", "transcript:s2:1"):
        assert r.resolve(p, policy_for(tmp_path)).status == "available"


def test_export_a_real_session_and_verify_every_pointer(tmp_path: Path) -> None:
    if not CC.is_file():
        pytest.skip("shared transcripts not found")
    messages = orjson.loads(CC.read_bytes())["messages"]
    events = [
        TranscriptEvent(f"msg-{i}", "message", m["role"], m["content"], "2025-01-01T00:00:00Z")
        for i, m in enumerate(messages)
    ]
    session = "3af9b1a7-6512-4883-ad18-320658ced099"
    half = len(events) // 2
    pointers = append_events(str(tmp_path / "t"), session, events[:half])
    pointers += append_events(str(tmp_path / "t"), session, events[half:])
    assert len(pointers) == len(messages)
    lines = (tmp_path / "t" / f"{session}.jsonl").read_bytes().split(b"\n")[:-1]
    got = SourceResolver().resolve_many(pointers, policy_for(tmp_path))
    assert got == tuple(Resolution("available", sha(line)) for line in lines)
    assert [orjson.loads(line)["content"] for line in lines] == [m["content"] for m in messages]


def test_a_partial_last_line_is_dropped_before_appending(tmp_path: Path) -> None:
    root = tmp_path / "t"
    append_events(str(root), "s1", [event(1)])
    with (root / "s1.jsonl").open("ab") as f:
        f.write(b'{"schema_version":1,"sequence":2,"sess')  # a writer died here
    assert append_events(str(root), "s1", [event(2)]) == ("transcript:s1:2",)
    lines = (root / "s1.jsonl").read_bytes().split(b"\n")
    assert [orjson.loads(x)["sequence"] for x in lines[:-1]] == [1, 2]
    assert SourceResolver().resolve("transcript:s1:2", policy_for(tmp_path)).status == "available"


def test_a_file_of_only_a_fragment_starts_over(tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    (root / "s1.jsonl").write_bytes(b'{"half a rec')
    assert append_events(str(root), "s1", [event(1)]) == ("transcript:s1:1",)


@pytest.mark.parametrize(
    "tail",
    [
        orjson.dumps({"sequence": 1, "session_id": "someone-else", "event_id": "e"}) + b"\n",
        b"not json\n",
        orjson.dumps({"sequence": "1", "session_id": "s1"}) + b"\n",
        b"[]\n",
    ],
)
def test_refuses_to_append_after_a_foreign_or_broken_tail(tmp_path: Path, tail: bytes) -> None:
    root = tmp_path / "t"
    root.mkdir()
    (root / "s1.jsonl").write_bytes(tail)
    with pytest.raises(ValueError):
        append_events(str(root), "s1", [event(1)])
    assert (root / "s1.jsonl").read_bytes() == tail


def test_a_bad_event_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "t"
    append_events(str(root), "s1", [event(1)])
    before = (root / "s1.jsonl").read_bytes()
    with pytest.raises(ValueError):
        append_events(
            str(root), "s1", [event(2), event(3, content="x" * 2000)], max_record_bytes=1000
        )
    with pytest.raises(TypeError):
        append_events(str(root), "s1", [event(2), event(3, content={1: object()})])
    assert (root / "s1.jsonl").read_bytes() == before


@pytest.mark.parametrize(
    "kwargs",
    [
        {"event_id": ""},
        {"event_id": 1},
        {"type": ""},
        {"recorded_at": None},
        {"role": 3},
    ],
)
def test_transcript_event_validates(kwargs: dict[str, object]) -> None:
    base: dict[str, object] = {
        "event_id": "e",
        "type": "message",
        "role": None,
        "content": None,
        "recorded_at": "2025-01-01T00:00:00Z",
    }
    with pytest.raises(ValueError):
        TranscriptEvent(**{**base, **kwargs})  # type: ignore[arg-type]


def test_refuses_a_symlinked_transcript(tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    victim = tmp_path / "victim.jsonl"
    victim.write_bytes(b"")
    os.symlink(victim, root / "s1.jsonl")
    with pytest.raises(OSError):
        append_events(str(root), "s1", [event(1)])
    assert victim.read_bytes() == b""


def test_refuses_a_non_regular_transcript(tmp_path: Path) -> None:
    root = tmp_path / "t"
    (root / "s1.jsonl").mkdir(parents=True)
    with pytest.raises(OSError):
        append_events(str(root), "s1", [event(1)])


def test_concurrent_appends_are_contiguous(tmp_path: Path) -> None:
    root = str(tmp_path / "t")
    barrier = threading.Barrier(8)

    def work(i: int) -> tuple[str, ...]:
        barrier.wait()
        out: tuple[str, ...] = ()
        for k in range(10):
            out += append_events(root, "s1", [event(100 * i + k), event(100 * i + k + 50)])
        return out

    with ThreadPoolExecutor(8) as pool:
        pointers = [p for batch in pool.map(work, range(8)) for p in batch]
    assert sorted(pointers, key=lambda p: int(p.rsplit(":", 1)[1])) == [
        f"transcript:s1:{n}" for n in range(1, 161)
    ]
    # resolving the last record verifies every record before it: contiguous, one session
    assert SourceResolver().resolve("transcript:s1:160", policy_for(tmp_path)).status == "available"


def test_relative_root_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        append_events("relative/root", "s1", [event(1)])
    with pytest.raises(ValueError):
        write_artifact("relative/root", "s1", "a", b"")


# ---------------------------------------------------------------------------- artifacts


def test_write_artifact_returns_a_full_digest_pointer(tmp_path: Path) -> None:
    data = b"\x00binary\xff" * 1000
    pointer = write_artifact(str(tmp_path / "a"), "s1", "out.bin", data)
    assert pointer == f"artifact:s1:out.bin:{sha(data)}"
    path = tmp_path / "a" / "s1" / "tool-results" / "out.bin"
    assert path.read_bytes() == data
    assert sorted(os.listdir(path.parent)) == ["out.bin"]  # no temporary left behind
    assert SourceResolver().resolve(pointer, policy_for(tmp_path)) == Resolution(
        "available", sha(data)
    )
    assert parse_pointer(pointer) != parse_pointer(pointer[:-52])  # 12-hex prefix is another text


def test_rewrite_replaces_atomically(tmp_path: Path) -> None:
    root = str(tmp_path / "a")
    first = write_artifact(root, "s1", "x", b"one")
    second = write_artifact(root, "s1", "x", b"two")
    r = SourceResolver()
    assert r.resolve(first, policy_for(tmp_path)).status == "corrupt"
    assert r.resolve(second, policy_for(tmp_path)).status == "available"
    assert sorted(os.listdir(tmp_path / "a" / "s1" / "tool-results")) == ["x"]


def test_refuses_symlinked_directories(tmp_path: Path) -> None:
    root = tmp_path / "a"
    root.mkdir()
    outside = tmp_path / "outside"
    (outside / "tool-results").mkdir(parents=True)
    os.symlink(outside, root / "s1")
    with pytest.raises(NotADirectoryError):
        write_artifact(str(root), "s1", "x", b"data")
    (root / "s2").mkdir()
    os.symlink(outside / "tool-results", root / "s2" / "tool-results")
    with pytest.raises(NotADirectoryError):
        write_artifact(str(root), "s2", "x", b"data")
    (root / "s3").write_bytes(b"a file")
    with pytest.raises(NotADirectoryError):
        write_artifact(str(root), "s3", "x", b"data")
    assert os.listdir(outside / "tool-results") == []


def test_a_failed_rename_leaves_no_temporary(tmp_path: Path) -> None:
    root = tmp_path / "a"
    (root / "s1" / "tool-results" / "taken").mkdir(parents=True)
    with pytest.raises(OSError):
        write_artifact(str(root), "s1", "taken", b"data")
    assert os.listdir(root / "s1" / "tool-results") == ["taken"]


def test_artifact_data_must_be_bytes(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        write_artifact(str(tmp_path), "s1", "x", "text")  # type: ignore[arg-type]
