"""What grows in a soaked proxy, from bench/soak_probe.py's files (bench_soak ``--find`` and
``--native``): the named structures, the allocation sites and the object types that grew between
two snapshots; the native memory counters per minute (malloc's heap in use and free, SQLite's own).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

MB = 1024 * 1024


def find_report(probe: Path, top: int = 30) -> None:
    """What grew between the second snapshot and the last: the named structures (every container
    an object of the proxy holds), the allocation sites (innermost frame in ``proxy/``, with
    tracemalloc) and the object types."""
    types = sorted(probe.glob("types-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    if len(types) < 3:
        print(f"--find: only {len(types)} snapshot(s); run longer")
        return
    ta, tb = json.loads(types[1].read_text()), json.loads(types[-1].read_text())
    print(f"--find: named structures from {types[1].stem} to {types[-1].stem} (items; all that grew):")
    grown = sorted(((n - ta["named"].get(k, 0), k, n) for k, n in tb["named"].items()), reverse=True)
    for diff, name, n in grown:
        if diff > 0:
            print(f"  {diff:+9d}  now {n:9d}  {name}")
    print("--find: live objects per type, growth:")
    tgrowth = sorted(((n - ta["counts"].get(t, 0), t, n) for t, n in tb["counts"].items()), reverse=True)
    for diff, t, n in tgrowth[:top]:
        print(f"  {diff:+9d}  now {n:9d}  {t}")
    snaps = sorted(probe.glob("snap-*.pickle"), key=lambda p: int(p.stem.split("-")[1]))
    if len(snaps) < 3:
        return
    import tracemalloc

    def by_site(path: Path) -> Counter[str]:
        sizes: Counter[str] = Counter()
        for stat in tracemalloc.Snapshot.load(str(path)).statistics("traceback"):
            frames = [f for f in stat.traceback if "/proxy/" in f.filename]
            site = frames[-1] if frames else stat.traceback[-1]
            outer = frames[0] if len(frames) > 1 else None
            where = f"{site.filename.split('/proxy/')[-1]}:{site.lineno}"
            if outer is not None:
                where += f" <- {outer.filename.split('/proxy/')[-1]}:{outer.lineno}"
            sizes[where] += stat.size
        return sizes

    a, b = by_site(snaps[1]), by_site(snaps[-1])
    growth = sorted(((b[k] - a.get(k, 0), k) for k in b), reverse=True)[:top]
    print(f"--find: allocation growth from {snaps[1].stem} to {snaps[-1].stem} (innermost proxy frame <- outermost):")
    for diff, where in growth:
        print(f"  {diff / 1024:+10.1f} KiB  now {b[where] / 1024:10.1f} KiB  {where}")


def native_report(probe: Path, minutes: float) -> list[dict[str, Any]]:
    """``--native``: the probe's native counters, the last sample of each minute of the load, and
    how much each grew over the second half (what the heap's growth is: in use by SQLite, in use
    by the rest, or free but kept)."""
    path = probe / "native.jsonl"
    samples = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    if len(samples) < 4:
        print(f"--native: only {len(samples)} sample(s); run longer")
        return samples
    t0 = samples[0]["t"]
    per_minute: dict[int, dict[str, Any]] = {}
    for sample in samples:
        minute = int((sample["t"] - t0) // 60) + 1
        if minute <= minutes:
            per_minute[minute] = {"minute": minute, **sample}
    rows = [per_minute[m] for m in sorted(per_minute)]
    for row in rows:  # --native-collect: what was in use once the garbage in cycles was collected
        after = row.pop("after_collect", None)
        if after is not None:
            in_use = "jemalloc_allocated" if "jemalloc_allocated" in after else "malloc_uordblks"
            row["in_use_collected"] = after.get(in_use, 0)
    cols = [c for c in ("RssAnon", "malloc_arena", "malloc_hblkhd", "malloc_uordblks", "malloc_fordblks",
                        "jemalloc_allocated", "jemalloc_active", "jemalloc_resident", "sqlite_memory_used",
                        "tracemalloc_traced", "tracemalloc_self", "in_use_collected") if c in rows[0]]
    print("--native: MB at each minute's last sample (uordblks: in use in malloc's heaps; fordblks: free"
          " but kept; hblkhd: mmapped chunks;"
          " sqlite: SQLite's own allocations, inside uordblks; traced: Python's, with --trace; self: tracemalloc's own;"
          " in_use_collected: in use right after a full collection, with --native-collect)")
    print("  min  " + "  ".join(f"{c.removeprefix('malloc_'):>12}" for c in cols)
          + "  threads  full collections (objects collected)")
    for row in rows:
        print(f"  {row['minute']:3d}  " + "  ".join(f"{row[c] / MB:12.1f}" for c in cols) + f"  {row['threads']:7d}"
              + f"  {row.get('gc_full_collections', 0):5d} ({row.get('gc_full_collected', 0)})"
              + (f"  collected now: {row['collected_now']} in {row['collect_ms']} ms of {row['gc_tracked']} tracked"
                 if "collected_now" in row else ""))
    half = rows[len(rows) // 2 - 1]
    last = rows[-1]
    print(f"--native: growth from minute {half['minute']} to {last['minute']}: " + ", ".join(
        f"{c.removeprefix('malloc_')} {(last[c] - half[c]) / MB:+.1f} MB" for c in cols))
    return rows
