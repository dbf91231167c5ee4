"""The store's hottest paths under a full-speed replay: this checkout's query layer
(``proxy/store``), a SQLAlchemy Core prototype of the same paths (``bench/store_sqlalchemy.py``)
and, with ``--baseline-root``, another checkout's store, side by side in one interleaved run.

    pip install -e '.[bench]'              # SQLAlchemy and aiosqlite, for the prototype
    . .ci/pg.env                           # PostgreSQL too (bash .ci/pg start)
    python bench/bench_store.py [--passes 5] [--backends sqlite,postgres]
        [--targets own,sqlalchemy] [--baseline-root /path/to/checkout] [--json out.json]

The real Claude Code session (``tests/data/transcripts/cc_mclaude_…json``) is replayed turn by
turn, as fast as each store answers: for every request ending on a user turn (108 a pass), what
the proxy asks of its store, awaited in order:

* ``session read``: ``current_state`` (every request with a session, before it is forwarded);
* ``admission``: ``quota_add`` of two counters (every request of a tenant with budgets);
* ``recorder``: what the transcript recorder does for the turn (``proxy.server.context.durable``):
  ``recorded_prefix``, ``transcript_keys_held`` of the previous answer's slot,
  ``record_transcript`` of the request's new messages, then of the answer.

Each target runs in a process of its own (its own SQLite file, or its own PostgreSQL schema),
started once; every pass is a new session, replayed in blocks of ``--block`` turns: each block is
sent to the targets one after the other, in an order shuffled every block (a seeded shuffle, not a
rotation: a rotation would always put the same target after the same one, which then pays for
its disk flushes), so they share the machine's noise (disk flushes above all: every write commits
with ``synchronous = FULL``). A
warm-up pass is not counted. Printed: p50 and p99 of each step in ms, and turns per second (the
turns over the time the target spent on them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("session read", "admission", "recorder")


# -- the worker: one target, one backend ---------------------------------------------------------


def _turns() -> list[tuple[list[Any], Any]]:
    """(the request's messages, the answer that followed) for each request of the session."""
    from proxy.replay.readers import load_conversation

    path = ROOT / "tests/data/transcripts/cc_mclaude_3af9b1a7_with_autocompact_full.json"
    messages = list(load_conversation(str(path)).messages)
    return [
        (messages[:k], messages[k] if k < len(messages) else {"role": "assistant", "content": "ok"})
        for k in range(1, len(messages) + 1)
        if messages[k - 1]["role"] == "user"
    ]


async def _worker(target: str, url: str) -> None:
    from proxy.core.quota import Counter
    from proxy.store import Prefix, TranscriptEvent, open_store

    try:
        from proxy.store import KeyedEvent
    except ImportError:  # a checkout from before proxy/store/sql.py
        from proxy.store.transcript_keys import KeyedEvent  # type: ignore[no-redef]

    store: Any = await open_store(url)  # the schema, as the proxy makes it
    if target == "sqlalchemy":
        sys.path.insert(0, str(ROOT / "bench"))
        from store_sqlalchemy import SQLAlchemyStore

        await store.close()
        store = SQLAlchemyStore(url)
    turns = _turns()
    tenant = "bench"

    def event(n: int, message: Any, kind: str) -> Any:
        role = message.get("role", "user") if isinstance(message, dict) else "user"
        content = message.get("content") if isinstance(message, dict) else message
        return TranscriptEvent(f"evt-{n}", "2026-01-01T00:00:00+00:00", kind, role, content, True)  # type: ignore[arg-type]

    async def block(session: str, first: int, count_: int) -> dict[str, list[float]]:
        times: dict[str, list[float]] = {step: [] for step in STEPS}
        window = int(time.time() // 60 * 60_000)
        for messages, answer in turns[first : first + count_]:
            count = len(messages)
            t0 = time.perf_counter()
            await store.current_state(tenant, session)
            t1 = time.perf_counter()
            await store.quota_add(tenant, [
                Counter("tenant", "input_tokens", "minute", window, window + 60_000, 10**9, 1000 + count),
                Counter("tenant", "requests", "minute", window, window + 60_000, 10**6, 1),
            ])  # fmt: skip
            t2 = time.perf_counter()
            head = await store.recorded_prefix(tenant, session)
            if head.count:
                await store.transcript_keys_held(tenant, session, [f"a{head.count}"])
            new = [
                KeyedEvent(f"m{i}", event(i, messages[i], "message"))
                for i in range(head.count, count)
            ]
            if new:
                await store.record_transcript(tenant, session, new, Prefix(count, f"h{count}"))
            answered = KeyedEvent(f"a{count}", event(count, answer, "answer"))
            await store.record_transcript(tenant, session, [answered], Prefix(count + 1, f"h{count + 1}"))
            t3 = time.perf_counter()
            for step, seconds in zip(STEPS, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                times[step].append(seconds)
        return times

    print(len(turns), flush=True)
    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            n, first, count_ = line.split()
            started = time.perf_counter()
            times = await block(f"pass-{n}", int(first), int(count_))
            print(json.dumps({"times": times, "wall": time.perf_counter() - started}), flush=True)
    finally:
        await store.close()


# -- the parent: targets, rotation, figures ------------------------------------------------------


def _pg_schema(base: str, create: bool, schema: str) -> str:
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect(base)
        try:
            await conn.execute(f'{"CREATE" if create else "DROP"} SCHEMA "{schema}"{"" if create else " CASCADE"}')
        finally:
            await conn.close()

    asyncio.run(run())
    parts = urlsplit(base)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "search_path"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("search_path", schema)])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=5, help="passes counted (default 5)")
    parser.add_argument("--block", type=int, default=6, help="turns per block (default 6)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--targets", default="own,sqlalchemy")
    parser.add_argument("--baseline-root", help="another checkout (with its .venv): one more target")
    parser.add_argument("--pg", default=os.environ.get("CONTEXT_PROXY_TEST_PG"), help="PostgreSQL URL")
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--_worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._worker:
        asyncio.run(_worker(*args._worker))
        return

    folder = Path(tempfile.mkdtemp(prefix="bench-store-"))
    targets = [(t, sys.executable) for t in args.targets.split(",") if t]
    if args.baseline_root:
        targets.append(("baseline", str(Path(args.baseline_root) / ".venv/bin/python")))
    workers: dict[tuple[str, str], subprocess.Popen[str]] = {}
    schemas: list[str] = []
    for backend in args.backends.split(","):
        if backend == "postgres" and not args.pg:
            print("postgres skipped: no --pg / CONTEXT_PROXY_TEST_PG", file=sys.stderr)
            continue
        for target, python in targets:
            if backend == "sqlite":
                url = f"sqlite:///{folder / f'{target}.db'}"
            else:
                schema = f"bench_{target}_{secrets.token_hex(4)}"
                schemas.append(schema)
                url = _pg_schema(args.pg, True, schema)
            proc = subprocess.Popen(
                [python, __file__, "--_worker", target, url],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=folder,
            )  # fmt: skip
            assert proc.stdout is not None
            turns = int(proc.stdout.readline())
            workers[(target, backend)] = proc
    results: dict[tuple[str, str], list[dict[str, Any]]] = {key: [] for key in workers}
    keys = list(workers)
    try:
        shuffle = random.Random(20261206).shuffle
        for n in range(args.passes + 1):  # pass 0: warm-up
            for first in range(0, turns, args.block):
                order = list(keys)
                shuffle(order)
                for key in order:
                    proc = workers[key]
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write(f"{n} {first} {args.block}\n")
                    proc.stdin.flush()
                    answer = json.loads(proc.stdout.readline())
                    if n:
                        results[key].append(answer)
            print(f"pass {n} done", file=sys.stderr)
    finally:
        for proc in workers.values():
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(60)
        for schema in schemas:
            _pg_schema(args.pg, False, schema)

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000

    rows = []
    for (target, backend), passes in results.items():
        row: dict[str, Any] = {"target": target, "backend": backend}
        for step in STEPS:
            values = [v for p in passes for v in p["times"][step]]
            row[step] = (round(pct(values, 0.5), 3), round(pct(values, 0.99), 3))
        done = sum(len(p["times"]["recorder"]) for p in passes)
        row["turns/s"] = round(done / sum(p["wall"] for p in passes), 1)
        rows.append(row)
    print("| backend | target | " + " | ".join(f"{s} p50 / p99 ms" for s in STEPS) + " | turns/s |")
    print("|---|---|" + "---|" * (len(STEPS) + 1))
    for row in sorted(rows, key=lambda r: (r["backend"], r["target"])):
        cells = " | ".join(f"{row[s][0]:.3f} / {row[s][1]:.3f}" for s in STEPS)
        print(f"| {row['backend']} | {row['target']} | {cells} | {row['turns/s']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
