"""The durable-context crash-safety test at the proxy level, on SQLite and on PostgreSQL.

``context-proxy serve`` runs as a child process on a store (a SQLite file, or a fresh schema on
the PostgreSQL server ``.ci/pg start`` started; that variant is skipped without
``CONTEXT_PROXY_TEST_PG``). Two client threads write durable context through the proxy's own
admin API (``/admin/v1``, a tenant whose policy holds the admin token) as fast as they can, each
write with unique facts: one fact (``POST .../facts``) or a batch of three (``POST .../changes``,
all or nothing). The test SIGKILLs the process at a random moment in the middle of those writes,
starts it again on the same store, and checks, after every kill:

* every write the client got a success answer for is there, with exactly the content sent,
  read back through the admin API of the restarted process *and* through the store directly;
* nothing partial: every fact present was sent, with its whole content; a batch is all there or
  not at all; the history has one create per fact, seqs 1..N without a gap (a fresh fold of it
  checks versions); the SQLite file passes ``PRAGMA integrity_check`` / PostgreSQL's tables and
  indexes pass amcheck;
* no write was answered with anything but success while the process was up.

Writes in flight at the kill may or may not be there. ``--run-slow`` kills many more times.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import secrets
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import yaml

from proxy.core.durable import Create, Fact
from proxy.store import HistoryEntry, open_store
from tests.pg_server import fresh_schema, index_problems
from tests.test_cli import ServeProcess

TENANT = "crashy"
SESSION = "crash-s1"
TOKEN = "cpa-crash-proxy-admin-token-8c41f07d2b9e4a61"
SOURCE = f"transcript:{SESSION}:1"
CONFIRMED = "2025-01-01T00:00:00Z"
BATCH = 3  # facts per /changes write
WRITERS = 2


def _config(tmp_path: Path, store_url: str) -> Path:
    policies = tmp_path / "policies"
    policies.mkdir()
    policy = {
        "name": TENANT,
        "provider": {"mode": "passthrough"},
        "admin_tokens_sha256": [hashlib.sha256(TOKEN.encode()).hexdigest()],
    }
    (policies / f"{TENANT}.yaml").write_text(yaml.safe_dump(policy))
    config = {
        "state_dir": str(tmp_path / "state"),
        "store": {"url": store_url},
        "policies_dir": str(policies),
        "upstream": {"base_url": "http://127.0.0.1:9"},  # never contacted
        "shutdown": {"grace_seconds": 1},
    }
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Ledger:
    """What the clients sent and what the proxy acknowledged, across every run."""

    sent: dict[str, str] = field(default_factory=dict)  # fact id -> content
    batches: list[tuple[str, ...]] = field(default_factory=list)
    acked: set[str] = field(default_factory=set)
    bad_answers: list[str] = field(default_factory=list)  # a non-success HTTP answer
    early_errors: list[str] = field(default_factory=list)  # transport errors before the kill
    in_flight: int = 0  # requests cut by the kill (sent, answer never read)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _fact(fact_id: str, content: str) -> dict[str, str]:
    return {"id": fact_id, "content": content, "source": SOURCE, "last_confirmed_at": CONFIRMED}


def _writer(url: str, run: int, worker: int, ledger: Ledger, killing: threading.Event) -> None:
    """Write until the proxy goes away; every answer read in full and successful is acked."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, timeout=15, trust_env=False, headers=auth) as http:
        n = 0
        while True:
            n += 1
            base = f"f-{run}-{worker}-{n}"
            # Unique, and long enough that a torn record could not pass for a whole one.
            pad = secrets.token_hex(64 * (1 + n % 4))
            payload: dict[str, Any]
            if n % 2:
                ids: tuple[str, ...] = (base,)
                items = [_fact(base, f"fact {base} {pad}")]
                path, payload = f"/admin/v1/sessions/{SESSION}/facts", items[0]
            else:
                ids = tuple(f"{base}-{k}" for k in range(BATCH))
                items = [_fact(i, f"fact {i} {pad}") for i in ids]
                path = f"/admin/v1/sessions/{SESSION}/changes"
                payload = {"changes": [{"op": "create", "kind": "fact", "item": i} for i in items]}
            with ledger.lock:
                ledger.sent.update({i["id"]: i["content"] for i in items})
                if len(ids) > 1:
                    ledger.batches.append(ids)
            try:
                r = http.post(path, json=payload)
            except httpx.TransportError as exc:
                with ledger.lock:
                    if not killing.is_set():
                        ledger.early_errors.append(f"{path}: {exc!r}")
                    elif not isinstance(exc, httpx.ConnectError):
                        ledger.in_flight += 1
                return
            expected = 201 if len(ids) == 1 else 200
            if r.status_code != expected:
                with ledger.lock:
                    ledger.bad_answers.append(f"{path} -> {r.status_code} {r.text[:300]}")
                return
            answer = r.json()
            got = (answer["id"],) if len(ids) == 1 else tuple(a["id"] for a in answer["applied"])
            with ledger.lock:
                if got != ids:  # (recorded: an assertion in this thread would go unseen)
                    ledger.bad_answers.append(f"{path} -> applied {got}, sent {ids}")
                    return
                ledger.acked.update(ids)


def _run_and_kill(
    process: ServeProcess, run: int, ledger: Ledger, rng: random.Random
) -> tuple[int, int]:
    """Write through ``process`` and SIGKILL it mid-write; returns (acks before, acks at kill)."""
    killing = threading.Event()
    with ledger.lock:
        before = len(ledger.acked)
    threads = [
        threading.Thread(target=_writer, args=(process.url, run, w, ledger, killing), daemon=True)
        for w in range(WRITERS)
    ]
    for t in threads:
        t.start()
    target = before + rng.randint(1, 40)
    deadline = time.monotonic() + 30
    while True:
        with ledger.lock:
            done = len(ledger.acked) >= target
            stuck = bool(ledger.bad_answers or ledger.early_errors)
        if done or stuck or not any(t.is_alive() for t in threads):
            break
        assert time.monotonic() < deadline, "the writers make no progress"
        time.sleep(0.002)
    time.sleep(rng.uniform(0.0, 0.01))
    killing.set()
    process.proc.send_signal(signal.SIGKILL)
    code = process.stop()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a writer is still running after the kill"
    assert code == -signal.SIGKILL, f"the proxy stopped by itself ({code}):\n" + "".join(
        process.lines[-30:]
    )
    return before, len(ledger.acked)


def _check(facts: dict[str, tuple[str, str, str]], ledger: Ledger, where: str) -> None:
    """``facts``: id -> (content, source, last_confirmed_at), as ``where`` reports them."""
    missing = sorted(ledger.acked - facts.keys())
    assert not missing, f"{where}: {len(missing)} acknowledged facts are missing: {missing[:10]}"
    phantom = sorted(facts.keys() - ledger.sent.keys())
    assert not phantom, f"{where}: facts nobody sent: {phantom[:10]}"
    for fact_id, (content, source, confirmed) in facts.items():
        assert content == ledger.sent[fact_id], f"{where}: {fact_id} has other content"
        assert (source, confirmed) == (SOURCE, CONFIRMED), f"{where}: {fact_id} is altered"
    for ids in ledger.batches:
        present = [i for i in ids if i in facts]
        assert present in ([], list(ids)), f"{where}: a batch is partly written: {present}"


def _admin_view(url: str, ledger: Ledger) -> dict[str, tuple[str, str, str]]:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, timeout=30, trust_env=False, headers=auth) as http:
        assert http.get("/readyz").status_code == 200
        r = http.get(f"/admin/v1/sessions/{SESSION}/state")
        if r.status_code == 404 and not ledger.acked:
            return {}  # nothing was ever written
        assert r.status_code == 200, r.text
        state = r.json()
        assert state["pending"] == state["evidence"] == state["retired"] == []
        facts: dict[str, tuple[str, str, str]] = {}
        for record in state["facts"]:
            item = record["item"]
            assert record["kind"] == "fact" and record["version"] == 1, record
            assert record["id"] not in facts, f"admin API: {record['id']} twice"
            facts[record["id"]] = (item["content"], item["source"], item["last_confirmed_at"])
        history = http.get(f"/admin/v1/sessions/{SESSION}/history").json()["history"]
        assert [h["seq"] for h in history] == list(range(1, len(history) + 1))
        assert sorted(h["change"]["item"]["id"] for h in history) == sorted(facts)
        return facts


async def _store_view(store_url: str) -> tuple[dict[str, tuple[str, str, str]], list[HistoryEntry]]:
    store = await open_store(store_url)
    try:
        state = await store.current_state(TENANT, SESSION)  # a fresh fold: versions checked
        history = list(await store.history(TENANT, SESSION))
    finally:
        await store.close()
    facts = {f.id: (f.content, f.source, f.last_confirmed_at) for f in state.facts}
    assert len(facts) == len(state.facts)
    assert not state.pending and not state.evidence
    return facts, history


def _verify(process: ServeProcess, store_url: str, ledger: Ledger, sqlite_path: Path | None) -> int:
    admin = _admin_view(process.url, ledger)
    _check(admin, ledger, "admin API of the restarted proxy")
    direct, history = asyncio.run(_store_view(store_url))
    _check(direct, ledger, "the store")
    assert direct == admin
    assert [h.seq for h in history] == list(range(1, len(history) + 1))
    assert all(isinstance(h.event.change, Create) and h.event.version == 1 for h in history)
    created = [h.event.change.item for h in history if isinstance(h.event.change, Create)]
    assert all(isinstance(item, Fact) for item in created)
    assert sorted(item.id for item in created) == sorted(direct)  # each fact created once
    if sqlite_path is not None:
        conn = sqlite3.connect(sqlite_path)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        finally:
            conn.close()
    else:
        assert index_problems(store_url) == []
    return len(direct)


def _crash_loop(tmp_path: Path, store_url: str, sqlite_path: Path | None, kills: int) -> None:
    config = _config(tmp_path, store_url)
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    ledger = Ledger()
    process = ServeProcess(config)
    try:
        for run in range(kills):
            before, at_kill = _run_and_kill(process, run, ledger, rng)
            context = f"kill {run + 1}/{kills} (seed {seed})"
            assert not ledger.early_errors, f"{context}: {ledger.early_errors}"
            assert not ledger.bad_answers, f"{context}: {ledger.bad_answers}"
            assert at_kill > before, f"{context}: nothing was acknowledged before the kill"
            process = ServeProcess(config)  # restarted on the same store
            try:
                _verify(process, store_url, ledger, sqlite_path)
            except AssertionError as exc:
                raise AssertionError(f"after {context}: {exc}") from exc
    finally:
        process.stop()
    # The kills landed in the middle of requests, not only between them.
    assert ledger.in_flight >= 1, "no request was ever in flight at a kill"
    assert len(ledger.acked) >= kills


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path | None]]:
    if request.param == "postgres":
        with fresh_schema("crashproxy") as url:
            yield url, None
    else:
        path = tmp_path / "crash.db"
        yield f"sqlite:///{path}", path


@pytest.mark.timeout(180)
def test_acknowledged_admin_writes_survive_sigkill_of_the_proxy(
    tmp_path: Path, store: tuple[str, Path | None]
) -> None:
    url, sqlite_path = store
    _crash_loop(tmp_path, url, sqlite_path, kills=5)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_acknowledged_admin_writes_survive_50_sigkills_of_the_proxy(
    tmp_path: Path, store: tuple[str, Path | None]
) -> None:
    url, sqlite_path = store
    _crash_loop(tmp_path, url, sqlite_path, kills=50)
