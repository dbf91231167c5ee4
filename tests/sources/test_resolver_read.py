"""``SourceResolver.read``: the pointed bytes, after exactly the checks ``resolve`` makes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from proxy.sources.resolver import SourceResolver
from tests.sources.conftest import A_TXT, A_TXT_SHA, AuditOpener, Tenant


def test_reads_an_artifact_and_a_transcript_record(tenant_a: Tenant) -> None:
    r = SourceResolver()
    resolution, data = r.read(f"artifact:s1:a.txt:{A_TXT_SHA}", tenant_a.policy)
    assert resolution.status == "available" and data == A_TXT
    assert resolution == r.resolve(f"artifact:s1:a.txt:{A_TXT_SHA}", tenant_a.policy)
    resolution, data = r.read("transcript:s1:3", tenant_a.policy)
    assert resolution.status == "available" and data == tenant_a.lines("s1")[2]
    assert resolution.evidence_sha256 == hashlib.sha256(data).hexdigest()


def test_nothing_is_read_unless_available(tenant_a: Tenant, tenant_b: Tenant, outside: Path) -> None:
    audit = AuditOpener()
    r = SourceResolver(opener=audit)
    target = hashlib.sha256((outside / "secret.txt").read_bytes()).hexdigest()
    os.symlink("a.txt", tenant_a.artifact("s1", "alias.txt"))
    cases = {
        f"artifact:s1:link-to-outside:{target}": "denied",  # a symlink, wherever it points
        f"artifact:s1:alias.txt:{A_TXT_SHA}": "denied",
        f"artifact:s1:a.txt:{'0' * 64}": "corrupt",  # digest mismatch
        f"artifact:s1:none.txt:{A_TXT_SHA}": "missing",
        "transcript:s1:99": "missing",
        "transcript:x1:1": "denied",  # outside the policy's session patterns
        "artifact:../x:y:0": "corrupt",
        "store:s1:1": "unsupported",
    }
    for pointer, status in cases.items():
        resolution, data = r.read(pointer, tenant_a.policy)
        assert (resolution.status, data) == (status, None), pointer
    # another tenant's source is simply absent under this tenant's roots
    assert r.read(f"artifact:s1:a.txt:{A_TXT_SHA}", tenant_b.policy)[1] is None
    audit.assert_inside(str(tenant_a.artifacts), str(tenant_a.transcripts), str(tenant_b.artifacts), str(tenant_b.transcripts))


def test_an_artifact_over_the_bound_is_corrupt(tenant_a: Tenant) -> None:
    resolution, data = SourceResolver().read(f"artifact:s1:a.txt:{A_TXT_SHA}", tenant_a.policy, max_bytes=len(A_TXT) - 1)
    assert (resolution.status, data) == ("corrupt", None)
