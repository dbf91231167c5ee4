"""The resolver against real files: every status, symlinks, tenants, excerpts, bounds, the cache."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from proxy.sources.artifact_files import write_artifact
from proxy.sources.policy import SourcePolicy, authorise
from proxy.sources.resolver import Resolution, ResolverLimits, SourceResolver
from proxy.sources.transcript_files import append_events
from tests.sources.conftest import (
    A_TXT,
    A_TXT_SHA,
    B_SECRET,
    BOTH,
    AuditOpener,
    Tenant,
    event,
    fifty_pointers,
)

MISSING = Resolution("missing", None)
DENIED = Resolution("denied", None)
CORRUPT = Resolution("corrupt", None)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def a_txt(tenant: Tenant) -> str:
    return f"artifact:s1:a.txt:{A_TXT_SHA}"


# ---------------------------------------------------------------------------- available


def test_transcript_available_with_the_records_exact_sha(tenant_a: Tenant) -> None:
    r = SourceResolver()
    lines = tenant_a.lines("s1")
    for seq in range(1, 6):
        got = r.resolve(f"transcript:s1:{seq}", tenant_a.policy)
        assert got == Resolution("available", sha(lines[seq - 1]))


def test_artifact_available_by_full_digest_or_12_hex_prefix(tenant_a: Tenant) -> None:
    r = SourceResolver()
    full = r.resolve(f"artifact:s1:a.txt:{A_TXT_SHA}", tenant_a.policy)
    short = r.resolve(f"artifact:s1:a.txt:{A_TXT_SHA[:12]}", tenant_a.policy)
    assert full == short == Resolution("available", A_TXT_SHA)


def test_empty_artifact(tenant_a: Tenant) -> None:
    pointer = write_artifact(str(tenant_a.artifacts), "s1", "empty", b"")
    assert SourceResolver().resolve(pointer, tenant_a.policy) == Resolution("available", sha(b""))


# ---------------------------------------------------------------------------- missing


def test_deleted_file_is_missing(tenant_a: Tenant) -> None:
    r = SourceResolver()
    assert r.resolve(a_txt(tenant_a), tenant_a.policy).status == "available"
    tenant_a.artifact("s1", "a.txt").unlink()
    assert r.resolve(a_txt(tenant_a), tenant_a.policy) == MISSING
    tenant_a.transcript("s1").unlink()
    assert r.resolve("transcript:s1:1", tenant_a.policy) == MISSING


@pytest.mark.parametrize(
    "pointer",
    [
        "transcript:s1:6",  # past the end
        "transcript:s2:1",  # no such session
        f"artifact:s2:a.txt:{A_TXT_SHA}",  # no session directory
        f"artifact:s1:b.txt:{A_TXT_SHA}",  # no such artifact
    ],
)
def test_missing(tenant_a: Tenant, pointer: str) -> None:
    assert SourceResolver().resolve(pointer, tenant_a.policy) == MISSING


def test_missing_root_is_missing(tmp_path: Path) -> None:
    policy = SourcePolicy(BOTH, ("*",), str(tmp_path / "nope"), str(tmp_path / "nope"))
    r = SourceResolver()
    assert r.resolve("transcript:s1:1", policy) == MISSING
    assert r.resolve(f"artifact:s1:a:{A_TXT_SHA}", policy) == MISSING


def test_partial_last_line_is_not_a_record_yet(tenant_a: Tenant) -> None:
    path = tenant_a.transcript("s1")
    record = orjson.dumps(
        {"sequence": 6, "session_id": "s1", "event_id": "evt-6", "type": "message"}
    )
    with path.open("ab") as f:
        f.write(record)  # no newline yet: a writer mid-append
    r = SourceResolver()
    assert r.resolve("transcript:s1:6", tenant_a.policy) == MISSING
    assert r.resolve("transcript:s1:5", tenant_a.policy).status == "available"
    with path.open("ab") as f:
        f.write(b"\n")
    assert r.resolve("transcript:s1:6", tenant_a.policy) == Resolution("available", sha(record))


# ---------------------------------------------------------------------------- denied


def test_policy_denial_happens_before_any_open(tenant_a: Tenant) -> None:
    audit = AuditOpener()
    r = SourceResolver(opener=audit)
    p = tenant_a.policy
    cases = [
        (replace(p, allowed_kinds=frozenset({"artifact"})), "transcript:s1:1"),
        (replace(p, allowed_kinds=frozenset({"transcript"})), a_txt(tenant_a)),
        (replace(p, allowed_kinds=frozenset()), "transcript:s1:1"),
        (replace(p, session_patterns=("t*",)), "transcript:s1:1"),
        (replace(p, session_patterns=()), a_txt(tenant_a)),
        (replace(p, session_patterns=("S1",)), "transcript:s1:1"),  # case-sensitive
        (replace(p, session_patterns=("s",)), "transcript:s1:1"),  # whole-id match
        (replace(p, transcript_root=None), "transcript:s1:1"),
        (replace(p, artifact_root=None), a_txt(tenant_a)),
        (p, "transcript:OTHER_TENANT_SESSION:1"),
    ]
    for policy, pointer in cases:
        assert r.resolve(pointer, policy) == DENIED
    assert audit.attempts == []


def test_session_patterns_are_globs() -> None:
    from proxy.core.pointers import TranscriptPointer

    policy = SourcePolicy(BOTH, ("proj-?-*", "exact", "[ab]x"), "/t", "/a")
    allowed = ["proj-1-abc", "proj-z-", "exact", "ax", "bx"]
    refused = ["proj-12-a", "exactly", "cx", "PROJ-1-a", "xexact"]
    for s in allowed:
        assert authorise(TranscriptPointer(s, 1), policy)
    for s in refused:
        assert not authorise(TranscriptPointer(s, 1), policy)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"allowed_kinds": frozenset({"transcript", "file"})},
        {"allowed_kinds": {"transcript"}},
        {"session_patterns": ["*"]},
        {"session_patterns": ("",)},
        {"session_patterns": ("a b",)},
        {"transcript_root": "relative/path"},
        {"artifact_root": "/a\x00b"},
    ],
)
def test_policy_validates_itself(kwargs: dict[str, object]) -> None:
    base: dict[str, object] = {
        "allowed_kinds": BOTH,
        "session_patterns": ("*",),
        "transcript_root": "/t",
        "artifact_root": "/a",
    }
    with pytest.raises(ValueError):
        SourcePolicy(**{**base, **kwargs})  # type: ignore[arg-type]


def test_symlinked_artifact_file_is_denied(tenant_a: Tenant, outside: Path) -> None:
    audit = AuditOpener()
    r = SourceResolver(opener=audit)
    target_sha = sha((outside / "secret.txt").read_bytes())
    assert r.resolve(f"artifact:s1:link-to-outside:{target_sha}", tenant_a.policy) == DENIED
    # ... even when it points at a valid file inside the root
    os.symlink("a.txt", tenant_a.artifact("s1", "alias.txt"))
    assert r.resolve(f"artifact:s1:alias.txt:{A_TXT_SHA}", tenant_a.policy) == DENIED
    audit.assert_inside(str(tenant_a.artifacts))


def test_symlinked_session_directory_pointing_outside_is_denied(
    tenant_a: Tenant, outside: Path
) -> None:
    # outside/tool-results/a.txt has exactly the bytes the pointer names.
    os.symlink(outside, tenant_a.artifacts / "s2")
    audit = AuditOpener()
    r = SourceResolver(opener=audit)
    assert r.resolve(f"artifact:s2:a.txt:{A_TXT_SHA}", tenant_a.policy) == DENIED
    audit.assert_inside(str(tenant_a.artifacts))


def test_symlinked_tool_results_directory_is_denied(tenant_a: Tenant, outside: Path) -> None:
    (tenant_a.artifacts / "s3").mkdir()
    os.symlink(outside / "tool-results", tenant_a.artifacts / "s3" / "tool-results")
    audit = AuditOpener()
    assert (
        SourceResolver(opener=audit).resolve(f"artifact:s3:a.txt:{A_TXT_SHA}", tenant_a.policy)
        == DENIED
    )
    audit.assert_inside(str(tenant_a.artifacts))


def test_symlinked_transcript_is_denied(tenant_a: Tenant, outside: Path) -> None:
    os.symlink(outside / "s1.jsonl", tenant_a.transcript("s4"))
    os.symlink("s1.jsonl", tenant_a.transcript("s5"))  # inside, still a symlink
    audit = AuditOpener()
    r = SourceResolver(opener=audit)
    assert r.resolve("transcript:s4:1", tenant_a.policy) == DENIED
    assert r.resolve("transcript:s5:1", tenant_a.policy) == DENIED
    audit.assert_inside(str(tenant_a.transcripts))


def test_dangling_symlink_is_denied_not_missing(tenant_a: Tenant) -> None:
    os.symlink("/nonexistent/x", tenant_a.artifact("s1", "dangling"))
    assert SourceResolver().resolve(f"artifact:s1:dangling:{A_TXT_SHA}", tenant_a.policy) == DENIED


def test_the_root_itself_may_be_reached_through_a_symlink(tenant_a: Tenant, tmp_path: Path) -> None:
    """The root is trusted configuration; only what is below it must be symlink-free."""
    os.symlink(tenant_a.artifacts, tmp_path / "artifacts-link")
    policy = replace(tenant_a.policy, artifact_root=str(tmp_path / "artifacts-link"))
    assert SourceResolver().resolve(a_txt(tenant_a), policy).status == "available"


# ---------------------------------------------------------------------------- corrupt


def test_replaced_artifact_bytes_are_corrupt(tenant_a: Tenant) -> None:
    r = SourceResolver()
    assert r.resolve(a_txt(tenant_a), tenant_a.policy).status == "available"
    path = tenant_a.artifact("s1", "a.txt")
    path.write_bytes(b"X" + A_TXT[1:])  # same size, other bytes
    assert r.resolve(a_txt(tenant_a), tenant_a.policy) == CORRUPT
    assert r.resolve(f"artifact:s1:a.txt:{A_TXT_SHA[:12]}", tenant_a.policy) == CORRUPT


def test_rewritten_artifact_old_pointer_corrupt_new_available(tenant_a: Tenant) -> None:
    r = SourceResolver()
    new = write_artifact(str(tenant_a.artifacts), "s1", "a.txt", b"version 2")
    assert r.resolve(a_txt(tenant_a), tenant_a.policy) == CORRUPT
    assert r.resolve(new, tenant_a.policy) == Resolution("available", sha(b"version 2"))


GOOD = {"schema_version": 1, "sequence": 1, "session_id": "s1", "event_id": "e1", "type": "x"}


def record(**changes: object) -> bytes:
    return orjson.dumps({**GOOD, **changes})


@pytest.mark.parametrize(
    "first_line",
    [
        pytest.param(b'{"sequence": 1, "session_id": "s1", "event_id": "e1"', id="invalid-json"),
        pytest.param(record(content="caf\u00e9").replace(b"\xc3\xa9", b"\xe9"), id="latin-1"),
        pytest.param(record(content="x").replace(b'"x"', b'"\xff"'), id="invalid-utf8-ff"),
        pytest.param(record(content="x").replace(b'"x"', b'"\xc0\xae"'), id="overlong-utf8"),
        pytest.param(record(content="x").replace(b'"x"', b'"\xed\xa0\x80"'), id="surrogate-utf8"),
        pytest.param(record(content="x").replace(b'"x"', b'"\\ud800"'), id="lone-surrogate-escape"),
        pytest.param(record(content="x").replace(b'"x"', b'"\xe2\x82"'), id="truncated-utf8"),
        pytest.param(b"\xef\xbb\xbf" + record(), id="bom"),
        pytest.param(b"", id="blank-line"),
        pytest.param(b"[1, 2]", id="array"),
        pytest.param(b'"just a string"', id="string"),
        pytest.param(b"null", id="null"),
        pytest.param(record(session_id="s2"), id="other-session"),
        pytest.param(record(session_id=None), id="null-session"),
        pytest.param(record(sequence=2), id="sequence-not-1"),
        pytest.param(record(sequence=0), id="sequence-0"),
        pytest.param(record(sequence="1"), id="sequence-string"),
        pytest.param(record(sequence=1.0), id="sequence-float"),
        pytest.param(record(sequence=True), id="sequence-bool"),
        pytest.param(orjson.dumps({k: v for k, v in GOOD.items() if k != "sequence"}), id="no-seq"),
        pytest.param(record(event_id=""), id="empty-event-id"),
        pytest.param(record(event_id=7), id="numeric-event-id"),
        pytest.param(orjson.dumps({k: v for k, v in GOOD.items() if k != "event_id"}), id="no-id"),
        pytest.param(b"NaN", id="nan"),
    ],
)
def test_bad_record_at_or_before_the_pointer_is_corrupt(
    tenant_a: Tenant, first_line: bytes
) -> None:
    path = tenant_a.transcript("s1")
    lines = tenant_a.lines("s1")
    path.write_bytes(b"\n".join([first_line, *lines[1:]]) + b"\n")
    r = SourceResolver()
    for seq in (1, 3, 5):
        assert r.resolve(f"transcript:s1:{seq}", tenant_a.policy) == CORRUPT


def test_sequence_gap_is_corrupt(tenant_a: Tenant) -> None:
    lines = tenant_a.lines("s1")
    tenant_a.transcript("s1").write_bytes(b"\n".join([lines[0], lines[2]]) + b"\n")
    r = SourceResolver()
    assert r.resolve("transcript:s1:1", tenant_a.policy).status == "available"
    assert r.resolve("transcript:s1:2", tenant_a.policy) == CORRUPT


def test_bad_lines_after_the_pointed_record_are_irrelevant(tenant_a: Tenant) -> None:
    lines = tenant_a.lines("s1")
    garbage = [b"not json", b"\xff\xfe", b"", record(session_id="intruder"), b"x" * 100]
    tenant_a.transcript("s1").write_bytes(b"\n".join([*lines[:3], *garbage]) + b"\n")
    r = SourceResolver()
    for seq in (1, 2, 3):
        assert r.resolve(f"transcript:s1:{seq}", tenant_a.policy) == Resolution(
            "available", sha(lines[seq - 1])
        )
    assert r.resolve("transcript:s1:4", tenant_a.policy) == CORRUPT


def test_crlf_records_hash_the_line_without_its_newline(tenant_a: Tenant) -> None:
    line = record()
    tenant_a.transcript("s1").write_bytes(line + b"\r\n")
    assert SourceResolver().resolve("transcript:s1:1", tenant_a.policy) == Resolution(
        "available", sha(line + b"\r")
    )


def test_record_size_bound(tenant_a: Tenant) -> None:
    big = record(content="x" * 5000)
    tenant_a.transcript("s1").write_bytes(
        record() + b"\n" + big.replace(b'"sequence":1', b'"sequence":2') + b"\n"
    )
    small = SourceResolver(ResolverLimits(max_record_bytes=4096, transcript_chunk_bytes=512))
    assert small.resolve("transcript:s1:1", tenant_a.policy).status == "available"
    assert small.resolve("transcript:s1:2", tenant_a.policy) == CORRUPT
    assert SourceResolver().resolve("transcript:s1:2", tenant_a.policy).status == "available"


def test_unterminated_oversized_tail_is_corrupt(tenant_a: Tenant) -> None:
    tenant_a.transcript("s1").write_bytes(record() + b"\n" + b"y" * 10_000)
    small = SourceResolver(ResolverLimits(max_record_bytes=4096, transcript_chunk_bytes=512))
    assert small.resolve("transcript:s1:2", tenant_a.policy) == CORRUPT


def test_scan_bound(tenant_a: Tenant) -> None:
    lines = tenant_a.lines("s1")
    limits = ResolverLimits(max_transcript_scan_bytes=len(lines[0]) + len(lines[1]) + 2)
    r = SourceResolver(limits)
    assert r.resolve("transcript:s1:2", tenant_a.policy).status == "available"
    assert r.resolve("transcript:s1:3", tenant_a.policy) == CORRUPT


def test_artifact_size_bound(tenant_a: Tenant) -> None:
    data = b"z" * 10_000
    pointer = write_artifact(str(tenant_a.artifacts), "s1", "big.bin", data)
    small = SourceResolver(ResolverLimits(max_artifact_bytes=9_999, artifact_chunk_bytes=1000))
    assert small.resolve(pointer, tenant_a.policy) == CORRUPT
    chunked = SourceResolver(ResolverLimits(artifact_chunk_bytes=7))
    assert chunked.resolve(pointer, tenant_a.policy) == Resolution("available", sha(data))


def test_non_regular_final_objects_are_corrupt_and_never_opened(tenant_a: Tenant) -> None:
    tool_results = tenant_a.artifacts / "s1" / "tool-results"
    os.mkfifo(tool_results / "fifo")
    (tool_results / "dir").mkdir()
    names = ["fifo", "dir"]
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tool_results / "sock"))
        names.append("sock")
    except OSError:  # path too long for AF_UNIX under some tmp dirs
        pass
    os.mkfifo(tenant_a.transcript("s6"))
    tenant_a.transcript("s7").mkdir()
    audit = AuditOpener()
    r = SourceResolver(opener=audit)
    try:
        for name in names:
            assert r.resolve(f"artifact:s1:{name}:{A_TXT_SHA}", tenant_a.policy) == CORRUPT
        assert r.resolve("transcript:s6:1", tenant_a.policy) == CORRUPT
        assert r.resolve("transcript:s7:1", tenant_a.policy) == CORRUPT
    finally:
        sock.close()
    opened_names = {name for _, name in audit.attempts}
    assert opened_names.isdisjoint({*names, "s6.jsonl", "s7.jsonl"})  # lstat-ed, never opened


def test_a_file_where_the_layout_has_a_directory_is_corrupt(tenant_a: Tenant) -> None:
    (tenant_a.artifacts / "s8").write_bytes(b"not a directory")
    (tenant_a.artifacts / "s9").mkdir()
    (tenant_a.artifacts / "s9" / "tool-results").write_bytes(b"not a directory")
    r = SourceResolver()
    assert r.resolve(f"artifact:s8:a.txt:{A_TXT_SHA}", tenant_a.policy) == CORRUPT
    assert r.resolve(f"artifact:s9:a.txt:{A_TXT_SHA}", tenant_a.policy) == CORRUPT


# ---------------------------------------------------------------------------- unsupported


def test_unknown_scheme_is_unsupported_without_any_open(tenant_a: Tenant) -> None:
    audit = AuditOpener()
    r = SourceResolver(opener=audit)
    assert r.resolve("store:s1:42", tenant_a.policy) == Resolution("unsupported", None)
    assert r.resolve(12, tenant_a.policy) == CORRUPT
    assert audit.attempts == []


def test_hard_link_is_not_detected(tenant_a: Tenant, outside: Path) -> None:
    """Documented limitation: a hard link inside a root is a regular file like any other.

    Making one needs write access to the root (and, with fs.protected_hardlinks, ownership of
    the target), i.e. a root that is already not trusted. Pinned here so a change is deliberate.
    """
    os.link(outside / "secret.txt", tenant_a.artifact("s1", "hardlink"))
    secret_sha = sha((outside / "secret.txt").read_bytes())
    got = SourceResolver().resolve(f"artifact:s1:hardlink:{secret_sha}", tenant_a.policy)
    assert got == Resolution("available", secret_sha)


# ---------------------------------------------------------------------------- tenants


def test_another_tenants_sources_look_exactly_missing(tenant_a: Tenant, tenant_b: Tenant) -> None:
    r = SourceResolver()
    b_pointers = [
        "transcript:s9:1",
        "transcript:s9:2",
        f"artifact:s9:b.txt:{sha(B_SECRET)}",
    ]
    for pointer in b_pointers:  # they exist and resolve for B ...
        assert r.resolve(pointer, tenant_b.policy).status == "available"
    truly_missing = r.resolve(f"artifact:s8:nothing:{A_TXT_SHA}", tenant_a.policy)
    truly_missing_x = r.resolve("transcript:s8:1", tenant_a.policy, excerpt=True)
    for pointer in b_pointers:  # ... and are indistinguishable from nothing for A
        for excerpt in (False, True):
            got = r.resolve(pointer, tenant_a.policy, excerpt=excerpt)
            assert got == truly_missing == truly_missing_x == MISSING
            assert repr(got) == repr(truly_missing)
            assert orjson.dumps(got) == orjson.dumps(truly_missing)


def test_other_tenant_session_outside_the_patterns_is_denied(
    tenant_a: Tenant, tenant_b: Tenant
) -> None:
    r = SourceResolver()
    pointer = f"artifact:OTHER_TENANT_SESSION:a.txt:{A_TXT_SHA}"
    assert r.resolve(pointer, tenant_b.policy).status == "available"
    assert r.resolve(pointer, tenant_a.policy) == DENIED


# ---------------------------------------------------------------------------- excerpts


def test_excerpt_only_when_asked_and_only_when_available(tenant_a: Tenant) -> None:
    r = SourceResolver()
    plain = r.resolve("transcript:s1:2", tenant_a.policy)
    with_excerpt = r.resolve("transcript:s1:2", tenant_a.policy, excerpt=True)
    assert plain.excerpt is None
    assert with_excerpt.excerpt == tenant_a.lines("s1")[1].decode()
    assert with_excerpt.evidence_sha256 == plain.evidence_sha256
    assert r.resolve(a_txt(tenant_a), tenant_a.policy, excerpt=True).excerpt == A_TXT.decode()
    tenant_a.artifact("s1", "a.txt").write_bytes(b"tampered")
    assert r.resolve(a_txt(tenant_a), tenant_a.policy, excerpt=True) == CORRUPT
    assert r.resolve("transcript:s1:9", tenant_a.policy, excerpt=True) == MISSING


@pytest.mark.parametrize("offset", range(4))
def test_excerpt_is_bounded_and_never_splits_a_character(tenant_a: Tenant, offset: int) -> None:
    text = "a" * offset + "\u20ac" * 5000  # 3-byte characters across every boundary
    pointer = write_artifact(str(tenant_a.artifacts), "s1", "euro.txt", text.encode())
    got = SourceResolver().resolve(pointer, tenant_a.policy, excerpt=True)
    assert got.excerpt is not None
    assert len(got.excerpt) == 2000
    assert got.excerpt == text[:2000]
    small = SourceResolver(ResolverLimits(max_excerpt_chars=7)).resolve(
        pointer, tenant_a.policy, excerpt=True
    )
    assert small.excerpt == text[:7]


def test_binary_artifact_excerpt_is_replaced_not_raised(tenant_a: Tenant) -> None:
    pointer = write_artifact(str(tenant_a.artifacts), "s1", "blob.bin", bytes(range(256)) * 40)
    got = SourceResolver().resolve(pointer, tenant_a.policy, excerpt=True)
    assert got.status == "available" and got.excerpt is not None
    assert len(got.excerpt) <= 2000 and "\ufffd" in got.excerpt


def test_transcript_excerpt_is_bounded(tenant_a: Tenant) -> None:
    append_events(str(tenant_a.transcripts), "s1", [event(6, content="\u00e9" * 9000)])
    got = SourceResolver().resolve("transcript:s1:6", tenant_a.policy, excerpt=True)
    assert got.excerpt is not None and len(got.excerpt) == 2000
    assert got.excerpt == tenant_a.lines("s1")[5].decode()[:2000]


# ---------------------------------------------------------------------------- cache


def test_warm_resolve_hits_the_cache_but_still_walks(tenant_a: Tenant) -> None:
    pointers = fifty_pointers(tenant_a)
    audit = AuditOpener()
    r = SourceResolver(opener=audit)
    cold = r.resolve_many(pointers, tenant_a.policy)
    assert all(x.status == "available" for x in cold)
    assert (r.hits, r.misses) == (0, 50)
    opens_cold = len(audit.attempts)
    warm = r.resolve_many(pointers, tenant_a.policy)
    assert warm == cold
    assert (r.hits, r.misses) == (50, 50)
    assert len(audit.attempts) == 2 * opens_cold  # the walk is repeated, the reads are not
    audit.assert_inside(str(tenant_a.transcripts), str(tenant_a.artifacts))


def test_resolve_many_keeps_order_and_handles_duplicates_and_garbage(tenant_a: Tenant) -> None:
    r = SourceResolver()
    got = r.resolve_many(
        ["transcript:s1:1", None, "transcript:s1:1", "nope", a_txt(tenant_a), "transcript:s1:99"],
        tenant_a.policy,
    )
    assert [x.status for x in got] == [
        "available",
        "corrupt",
        "available",
        "corrupt",
        "available",
        "missing",
    ]
    assert got[0] == got[2]


def test_changing_a_file_invalidates(tenant_a: Tenant) -> None:
    r = SourceResolver()
    pointer = a_txt(tenant_a)
    assert r.resolve(pointer, tenant_a.policy).status == "available"
    path = tenant_a.artifact("s1", "a.txt")
    st = path.stat()
    # same size, then mtime put back: only the ctime tells
    path.write_bytes(b"Y" * len(A_TXT))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    assert r.resolve(pointer, tenant_a.policy) == CORRUPT
    # appending to a transcript changes its size: re-verified
    assert r.resolve("transcript:s1:1", tenant_a.policy).status == "available"
    misses = r.misses
    with tenant_a.transcript("s1").open("r+b") as f:
        f.write(b"X")  # first byte of record 1 replaced, same size
    assert r.resolve("transcript:s1:1", tenant_a.policy) == CORRUPT
    assert r.misses == misses + 1


def test_a_cached_file_swapped_for_a_symlink_is_denied(tenant_a: Tenant, outside: Path) -> None:
    r = SourceResolver()
    assert r.resolve(a_txt(tenant_a), tenant_a.policy).status == "available"
    path = tenant_a.artifact("s1", "a.txt")
    path.unlink()
    os.symlink(outside / "tool-results" / "a.txt", path)
    assert r.resolve(a_txt(tenant_a), tenant_a.policy) == DENIED
    shutil.rmtree(tenant_a.artifacts / "s1")
    assert r.resolve(a_txt(tenant_a), tenant_a.policy) == MISSING


def test_the_cache_is_bounded_lru(tenant_a: Tenant) -> None:
    r = SourceResolver(ResolverLimits(cache_entries=3))
    for seq in range(1, 6):
        r.resolve(f"transcript:s1:{seq}", tenant_a.policy)
    assert r.cache_len == 3
    r.resolve("transcript:s1:5", tenant_a.policy)
    assert r.hits == 1
    r.resolve("transcript:s1:1", tenant_a.policy)  # evicted long ago
    assert r.hits == 1


def test_cache_is_per_policy_and_per_excerpt_flag(tenant_a: Tenant) -> None:
    r = SourceResolver()
    other = replace(tenant_a.policy, session_patterns=("s1", "s*"))
    r.resolve(a_txt(tenant_a), tenant_a.policy)
    r.resolve(a_txt(tenant_a), other)
    r.resolve(a_txt(tenant_a), tenant_a.policy, excerpt=True)
    assert (r.hits, r.misses) == (0, 3)


def test_thread_safety(tenant_a: Tenant) -> None:
    pointers = fifty_pointers(tenant_a)
    r = SourceResolver(ResolverLimits(cache_entries=20))  # constant eviction while threads race
    expected = SourceResolver().resolve_many(pointers, tenant_a.policy)
    barrier = threading.Barrier(8)

    def work(i: int) -> list[tuple[Resolution, ...]]:
        barrier.wait()
        out = []
        for k in range(20):
            if (i + k) % 2:
                out.append(r.resolve_many(pointers, tenant_a.policy))
            else:
                out.append(tuple(r.resolve(p, tenant_a.policy) for p in pointers))
        return out

    with ThreadPoolExecutor(8) as pool:
        results = [x for batch in pool.map(work, range(8)) for x in batch]
    assert all(res == expected for res in results)
    assert r.cache_len <= 20
    assert r.hits + r.misses == 8 * 20 * 50


def test_fd_hygiene(tenant_a: Tenant, outside: Path) -> None:
    pointers = [
        *fifty_pointers(tenant_a),
        "transcript:s1:99",
        f"artifact:s1:link-to-outside:{A_TXT_SHA}",
        f"artifact:nope:a:{A_TXT_SHA}",
        "garbage",
    ]
    before = len(os.listdir("/proc/self/fd"))
    r = SourceResolver()
    for _ in range(3):
        r.resolve_many(pointers, tenant_a.policy)
        for p in pointers:
            r.resolve(p, tenant_a.policy)
    assert len(os.listdir("/proc/self/fd")) == before
