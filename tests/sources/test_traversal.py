"""Every payload of the shared traversal corpus, in every pointer position and as a session id.

Each one must come back ``corrupt`` or ``denied`` (as its entry's ``expect`` says), never raise,
and never make the resolver open anything outside the tenant's roots: an auditing opener records
the realpath (via ``/proc/self/fd``) of every directory walked from and every fd handed out.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from proxy.core.pointers import BadPointer, is_valid_component, is_valid_session_id, parse_pointer
from proxy.sources.artifact_files import write_artifact
from proxy.sources.policy import authorise
from proxy.sources.resolver import SourceResolver
from proxy.sources.transcript_files import append_events
from tests.shared_data import TRAVERSAL_PAYLOADS
from tests.sources.conftest import A_TXT_SHA, AuditOpener, Tenant, event

PAYLOADS_FILE = TRAVERSAL_PAYLOADS if TRAVERSAL_PAYLOADS.is_file() else None
ENTRIES: list[dict[str, Any]] = (
    json.loads(PAYLOADS_FILE.read_text(encoding="utf-8")) if PAYLOADS_FILE else []
)
COMPONENTS = [e for e in ENTRIES if e["field"] == "component"]
POINTERS = [e for e in ENTRIES if e["field"] == "pointer"]

# Where the grammar and the corpus disagree, the issue wins; each case is explained.
SPEC_OVERRIDES = {
    # "an unknown scheme is unsupported": `file` is an unknown scheme and the rest has the generic
    # `scheme(:component)+` shape. Still rejected before any lookup (asserted below).
    "file:transcript:s1:1": "unsupported",
}
# Valid under the component grammar `[A-Za-z0-9][A-Za-z0-9._-]{0,199}`: a literal file name that is
# never decoded. It parses to exactly itself and resolves like any other absent name.
LITERAL_COMPONENTS = {"0x2e0x2e0x2f"}


def expected(entry: dict[str, Any]) -> str:
    override = SPEC_OVERRIDES.get(entry["payload"])
    if override is not None:
        return override
    expect = str(entry["expect"])
    assert expect.startswith("reject:")
    status = expect.removeprefix("reject:").split()[0]
    assert status in ("corrupt", "denied")
    return status


def placements(payload: str) -> dict[str, str]:
    return {
        "transcript-session": f"transcript:{payload}:1",
        "transcript-sequence": f"transcript:s1:{payload}",
        "artifact-session": f"artifact:{payload}:a.txt:{A_TXT_SHA}",
        "artifact-name": f"artifact:s1:{payload}:{A_TXT_SHA}",
        "artifact-digest": f"artifact:s1:a.txt:{payload}",
    }


def tree(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def test_the_corpus_is_there() -> None:
    if PAYLOADS_FILE is None:
        pytest.skip("shared/data/traversal-payloads.json not found")
    assert len(COMPONENTS) > 50 and len(POINTERS) > 30
    assert set(SPEC_OVERRIDES) <= {e["payload"] for e in POINTERS}
    assert LITERAL_COMPONENTS <= {e["payload"] for e in COMPONENTS}


@pytest.mark.parametrize("entry", POINTERS, ids=range(len(POINTERS)))
def test_pointer_payloads(tenant_a: Tenant, entry: dict[str, Any]) -> None:
    audit = AuditOpener()
    resolver = SourceResolver(opener=audit)
    got = resolver.resolve(entry["payload"], tenant_a.policy)
    assert got.status == expected(entry), entry["note"]
    assert got.evidence_sha256 is None and got.excerpt is None
    assert resolver.resolve(entry["payload"], tenant_a.policy, excerpt=True) == got
    audit.assert_inside(str(tenant_a.transcripts), str(tenant_a.artifacts))
    parsed = parse_pointer(entry["payload"])
    if isinstance(parsed, BadPointer) or not authorise(parsed, tenant_a.policy):
        assert audit.attempts == [], "a rejected pointer reached the filesystem"
    else:  # well-formed and authorised: rejected by the walk (symlink) or by content (hash)
        assert audit.attempts


@pytest.mark.parametrize("entry", COMPONENTS, ids=range(len(COMPONENTS)))
def test_component_payloads_in_every_position(tenant_a: Tenant, entry: dict[str, Any]) -> None:
    payload = entry["payload"]
    audit = AuditOpener()
    resolver = SourceResolver(opener=audit)
    permissive = replace(tenant_a.policy, session_patterns=("*",))
    texts = placements(payload)
    for policy in (tenant_a.policy, permissive):
        batch = resolver.resolve_many(list(texts.values()), policy)
        for (position, text), in_batch in zip(texts.items(), batch, strict=True):
            got = resolver.resolve(text, policy)
            assert got == in_batch
            parsed = parse_pointer(text)
            if payload in LITERAL_COMPONENTS and not isinstance(parsed, BadPointer):
                assert payload in (getattr(parsed, "session", None), getattr(parsed, "name", None))
                assert got.status in ("denied", "missing"), position
            else:
                assert got.status == expected(entry), (position, entry["note"])
    audit.assert_inside(str(tenant_a.transcripts), str(tenant_a.artifacts))
    if payload not in LITERAL_COMPONENTS:
        assert audit.attempts == [], "a corrupt pointer reached the filesystem"


@pytest.mark.parametrize("entry", COMPONENTS, ids=range(len(COMPONENTS)))
def test_component_payloads_as_session_ids_and_names(
    tmp_path: Path, tenant_a: Tenant, entry: dict[str, Any]
) -> None:
    payload = entry["payload"]
    if payload in LITERAL_COMPONENTS:
        assert is_valid_session_id(payload)
        return
    assert not is_valid_session_id(payload) and not is_valid_component(payload)
    before = tree(tmp_path)
    with pytest.raises(ValueError):
        append_events(str(tenant_a.transcripts), payload, [event(1)])
    with pytest.raises(ValueError):
        write_artifact(str(tenant_a.artifacts), payload, "x.txt", b"data")
    with pytest.raises(ValueError):
        write_artifact(str(tenant_a.artifacts), "s1", payload, b"data")
    assert tree(tmp_path) == before
