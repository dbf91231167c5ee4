"""What an ``available`` artifact check costs on an S3-compatible store, against the local
resolver: cold (nothing cached: the object is read and hashed) and cached (local: walk + fstat;
S3: one HEAD with the same ETag, plus the manifest row), through ``SourceChecks.resolve_many``,
the path ``/v1/messages`` and the admin preview take. Manifest entries and the audit trail live
in a SQLite file; the S3 server is moto's (``tests/s3_server.py``) on loopback, with signature
checking on.

    python bench/bench_sources.py                 # ~30 s
    python bench/bench_sources.py --n 100 --sizes 4096
    python bench/bench_sources.py --json out.json

moto is a Python server: its own time per request dominates the S3 rows, so read them as an
upper bound of the client's cost plus a slow server, not as what AWS S3 or MinIO would give.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.sources.checks import SourceChecks  # noqa: E402
from proxy.sources.manifests import SigningKeys  # noqa: E402
from proxy.sources.object_store import Credentials, ObjectStoreSettings  # noqa: E402
from proxy.sources.policy import SourcePolicy  # noqa: E402
from proxy.sources.resolver import SourceResolver  # noqa: E402
from proxy.store import open_store  # noqa: E402
from tests.s3_server import BUCKET, REGION, start_s3_server  # noqa: E402

KEYS = SigningKeys("k1", {"k1": b"bench-" + b"k" * 32})


def _pcts(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered), 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3),
    }


async def _time(checks: SourceChecks, policy: SourcePolicy, pointer: str, n: int, clear: Any) -> list[float]:
    out = []
    for _ in range(n):
        clear()
        started = time.perf_counter()
        (r,) = await checks.resolve_many("bench", policy, [pointer], session="s1", asked_by="bench")
        out.append((time.perf_counter() - started) * 1000)
        assert r.status == "available", r
    return out


async def run(n: int, sizes: list[int]) -> dict[str, Any]:
    s3 = start_s3_server()
    results: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            store = await open_store(f"sqlite:///{tmp}/bench.db")
            checks = SourceChecks(SourceResolver(), store)
            settings = ObjectStoreSettings(
                BUCKET, "bench/", s3.endpoint, REGION, "path",
                Credentials(s3.access_key_id, s3.secret_access_key),
            )
            local = SourcePolicy(frozenset({"artifact"}), ("*",), None, f"{tmp}/artifacts")
            local_signed = SourcePolicy(frozenset({"artifact"}), ("*",), None, f"{tmp}/signed", None, KEYS)
            remote = SourcePolicy(frozenset({"artifact"}), ("*",), None, f"{tmp}/unused", settings, KEYS)

            def clear_local() -> None:
                checks.local.clear_cache()

            def clear_remote() -> None:
                checks.artifacts._cache.clear()

            def keep() -> None:
                pass

            for size in sizes:
                data = os.urandom(size // 2).hex().encode()[:size]
                name = f"r{size}.txt"
                pointer = f"artifact:s1:{name}:{hashlib.sha256(data).hexdigest()}"
                for policy in (local, local_signed, remote):
                    await checks.write_artifacts("bench", policy, "s1", [(name, data)])
                row: dict[str, Any] = {}
                for label, policy, clear in (
                    ("local", local, clear_local),
                    ("local_signed", local_signed, clear_local),
                    ("s3", remote, clear_remote),
                ):
                    await _time(checks, policy, pointer, 10, clear)  # warm-up
                    row[f"{label}_cold"] = _pcts(await _time(checks, policy, pointer, n, clear))
                    await _time(checks, policy, pointer, 1, keep)
                    row[f"{label}_cached"] = _pcts(await _time(checks, policy, pointer, n, keep))
                for kind in ("cold", "cached"):
                    row[f"s3_added_{kind}_p50_ms"] = round(
                        row[f"s3_{kind}"]["p50_ms"] - row[f"local_{kind}"]["p50_ms"], 3
                    )
                results[str(size)] = row
            await checks.close()
            await store.close()
    finally:
        s3.stop()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=300, help="samples per row (default 300)")
    parser.add_argument("--sizes", default="4096,1048576", help="artifact sizes in bytes")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = asyncio.run(run(args.n, sizes))
    print(f"{'size':>9}  {'row':<20} {'p50 ms':>8} {'p99 ms':>8}")
    for size, row in results.items():
        for key, value in row.items():
            if isinstance(value, dict):
                print(f"{size:>9}  {key:<20} {value['p50_ms']:>8.3f} {value['p99_ms']:>8.3f}")
        print(
            f"{size:>9}  added by S3 (p50): cold {row['s3_added_cold_p50_ms']:.3f} ms,"
            f" cached {row['s3_added_cached_p50_ms']:.3f} ms"
        )
    if args.json:
        meta = {"machine": platform.platform(), "python": platform.python_version(), "n": args.n}
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
