"""Each bounded cache's documented memory (its ``entry_bytes``, or per byte of weight) is an upper
estimate of what its entries take: filled with entries shaped as the proxy makes them, traced by
``tracemalloc``, each stays at or under its figure, and not far under (the figures feed
``context_proxy_cache_bound_bytes`` and bench/bench_soak.py's verdict: they must stay honest).
docs/operations/memory.md lists them."""

from __future__ import annotations

import gc
import hashlib
import random
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.workloads import session_requests
from proxy.config.settings import CompactionConfig
from proxy.core import calibration, thinking, tokens
from proxy.core.bounded import Bounded
from proxy.core.calibration import Calibration
from proxy.core.compaction import Plan, PlanCache
from proxy.core.compaction.plan import PLAN_MEMORY_PER_JSON_BYTE
from proxy.core.durable import ChangeEvent, Create, Fact, apply
from proxy.core.pointers import PARSES, parse_pointer
from proxy.core.reparse import ENTRY_BYTES, MEMORY_PER_TEXT_BYTE, BodyMemo
from proxy.core.thinking import BindingRecords
from proxy.core.tokens import TokenCounter, canonical_all
from proxy.server.compaction import plan_reads, service
from proxy.server.compaction.calibration import KEY_BYTES, CalibrationKey
from proxy.server.compaction.plan_reads import AbsentPlans
from proxy.server.compaction.service import CompactionService
from proxy.server.http.metrics import new_metrics
from proxy.sources import resolver as resolver_module
from proxy.sources import store_artifacts, transcript_files
from proxy.sources.policy import SourcePolicy
from proxy.sources.resolver import Resolution
from proxy.sources.transcript_files import ExportMarks
from proxy.store import folding
from proxy.store.folding import StateCache
from proxy.store.usage import KEY_CHECKS, _key_problems

# a documented figure may overstate what an entry takes (allocator overhead, larger real
# entries), but by no more than this
SLACK = 2.5


# what glibc's malloc adds to each block (PYTHONMALLOC=malloc, as the image runs): an 8-byte
# header, and the size rounded up to 16 bytes
MALLOC_OVERHEAD = 16


def traced(fill: Callable[[], Any]) -> int:
    """Bytes ``fill`` leaves allocated (what it returns is kept until measured), each block with
    malloc's overhead."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        kept = fill()
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    del kept
    diff = after.compare_to(before, "filename")
    return sum(d.size_diff + MALLOC_OVERHEAD * d.count_diff for d in diff)


def check(measured: float, documented: float, what: str) -> None:
    assert measured <= documented, f"{what}: {measured:.0f} bytes each, documented {documented}"
    assert measured * SLACK >= documented, f"{what}: {measured:.0f} bytes each, documented {documented} (too high)"


def ident() -> int:
    return random.getrandbits(64)


N = 5000


def test_a_token_memo_entry_takes_at_most_its_figure() -> None:
    blocks = [{"type": "text", "text": f"block {i} of a tool result"} for i in range(N)]
    counter = TokenCounter(cache_size=N)
    counter.count_text("warm")  # the encoding is loaded before tracing (not an entry's)
    check(traced(lambda: [counter.count_block(b) for b in blocks]) / N, tokens.BLOCK_ENTRY_BYTES,
          "token_blocks")
    messages = [{"role": "user", "content": [{"type": "text", "text": f"message {i}"}]} for i in range(N)]
    canonical = canonical_all(messages)
    memo = TokenCounter(cache_size=0, message_cache_size=N)
    memo.count_text("warm")
    check(traced(lambda: memo.count_request(None, None, messages, canonical=canonical)) / N,
          tokens.MESSAGE_ENTRY_BYTES, "token_messages")


def test_thinking_records_absent_plans_calibration_and_export_marks_take_at_most_their_figures() -> None:
    records = BindingRecords(N)
    check(traced(lambda: records.learn({ident(): ident() for _ in range(N)})) / N,
          thinking.RECORD_BYTES, "thinking_records")
    absent = AbsentPlans(max_entries=N, clock=lambda: 1.0)
    check(traced(lambda: [absent.note(f"acme\x1fsession-{ident():016x}", f"{ident():016x}") for _ in range(N)]) / N,
          plan_reads.ABSENT_BYTES, "absent_plans")
    ratios = Calibration(N)
    check(traced(lambda: [ratios.observe(f"acme/claude-model-{i:06d}", 1000, 1100) for i in range(N)]) / N,
          calibration.RATIO_BYTES, "calibration")
    keys: Bounded[str, CalibrationKey] = Bounded("k", N, entry_bytes=1)
    check(traced(lambda: [keys.put(f"acme/claude-model-{i:06d}", CalibrationKey("acme", f"claude-model-{i:06d}"))
                          for i in range(N)]) / N, KEY_BYTES, "calibration_keys")
    marks = ExportMarks(N)
    root = "/var/lib/context-proxy/tenants/acme/transcripts"
    check(traced(lambda: [marks.put((root, f"{ident():016x}-4b1d-9f0e-aa61c2d3e4f5"),
                                    (ident() >> 24, ident() >> 34, ident() >> 2, i)) for i in range(N)]) / N,
          transcript_files.MARK_BYTES, "transcript_exports")


def test_a_request_policy_takes_at_most_its_figure() -> None:
    compaction = CompactionService(CompactionConfig(), "http://127.0.0.1:9", new_metrics())
    config = compaction.config
    n = 2000
    models = [f"claude-model-{i}-20250101" for i in range(n)]
    for model in models:  # the catalogue's own memo of what each name is: not the policies'
        compaction.catalogue.resolve(model)
    used = traced(lambda: [compaction._request_policy(config, model, "", 8192) for model in models])
    # one request-policy entry per model (their limits are alike: one compaction policy for all)
    assert len(compaction._request_policies) == n and len(compaction._policies) == 1
    check(used / n, service.POLICY_BYTES, "request_policies")


def test_a_folded_durable_state_of_a_few_facts_takes_at_most_its_figure() -> None:
    states = StateCache(N)

    def fill() -> None:
        for i in range(N):
            events = [
                ChangeEvent(1, Create(Fact(f"fact-{i}-{k}", f"Handler of task {i} fixed; tests pass ({k}).",
                                           f"transcript:soak-{i:016x}:{k + 1}", "2026-12-01T00:00:00Z")))
                for k in range(3)
            ]
            states.remember("acme", f"soak-{i:016x}", 3, apply(events))

    check(traced(fill) / N, folding.STATE_BYTES, "durable_states")


def test_a_verified_source_takes_at_most_its_figure(tmp_path: Path) -> None:
    policy = SourcePolicy(allowed_kinds=frozenset({"artifact", "transcript"}), session_patterns=("*",),
                          transcript_root=str(tmp_path), artifact_root=str(tmp_path))
    cache: Bounded[Any, Resolution] = Bounded("s", N, entry_bytes=1)
    excerpt = "x" * 2000  # max_excerpt_chars

    def fill() -> None:
        for i in range(N):
            digest = hashlib.sha256(str(i).encode()).hexdigest()
            pointer = parse_pointer(f"artifact:session-{i:08d}:tool_result_{i}.txt:{digest[:12]}")
            key = (policy, pointer, True, 2049, ident() >> 20, 4000, ident() >> 2, ident() >> 2)
            cache.put(key, Resolution("available", digest, excerpt[: 1999 - i % 7] + str(i)))

    used = traced(fill) / N
    check(used, resolver_module.CHECK_BYTES, "source_checks")
    assert used <= store_artifacts.VERIFIED_BYTES  # and an ETag and the manifest entry beside it


def test_a_pointer_parse_and_a_ledger_key_check_take_at_most_their_figures() -> None:
    _key_problems.cache_clear()
    n = min(N, KEY_CHECKS.max_entries)
    used = traced(lambda: [_key_problems("acme", f"soak-{ident():016x}") for _ in range(n)])
    check(used / n, KEY_CHECKS.entry_bytes, "ledger_key_checks")
    texts = [f"transcript:soak-{ident():016x}:{i + 1}" for i in range(n)]
    used = traced(lambda: [parse_pointer(t) for t in texts])
    check(used / n, PARSES.entry_bytes, "pointer_parses")


def test_a_plan_takes_at_most_its_figure_per_byte_of_json(transcript: dict[str, Any]) -> None:
    """Plans of the real Claude Code session (made by the compaction replay), one conversation
    each: their memory per byte of JSON."""
    from proxy.config.compaction import policy_from_config
    from proxy.replay.readers import load_conversation
    from proxy.replay.runner import run_replay
    from proxy.replay.summarisers import ExtractiveSummariser
    from tests.shared_data import CC_TRANSCRIPT

    counter = TokenCounter()
    made = PlanCache(100)
    run_replay(load_conversation(CC_TRANSCRIPT), policy_from_config(CompactionConfig(threshold=20_000)),
               ExtractiveSummariser(counter.count_text), offline=True, counter=counter, plans=made)
    texts = [slot.plan.to_json() for _key, group in made._groups.items() for slot in group]
    assert texts
    copies = []
    for r in range(40):
        for text in texts:
            value = orjson.loads(text)
            value["anchor"] = f"{r:04x}{value['anchor'][4:]}"
            copies.append(orjson.dumps(value))
    cache = PlanCache(10_000, max_bytes=1 << 30)
    used = traced(lambda: [cache.put(Plan.from_json(c), weight=len(c)) for c in copies])
    check(used / sum(map(len, copies)), PLAN_MEMORY_PER_JSON_BYTE, "compaction_plans per JSON byte")


@pytest.mark.parametrize("size", [100_000, 300_000])
def test_a_remembered_body_takes_at_most_its_figure_per_byte_of_text(size: int) -> None:
    """Claude Code's own bodies (the real session, tagged apart), each its own conversation."""
    bodies = []
    for tag in range(8):
        requests = session_requests(f"[memo {tag}]")
        text = next(orjson.dumps(r) for r in requests if len(orjson.dumps(r)) >= size)
        bodies.append(text)
    memo = BodyMemo(max_bytes=64 << 20)

    def fill() -> BodyMemo:
        for i, text in enumerate(bodies):
            memo.parse(f"conversation {i}", text).remember(())
        return memo

    used = traced(fill)
    assert len(memo) == len(bodies)
    text_bytes = sum(map(len, bodies))
    check((used - len(bodies) * ENTRY_BYTES) / text_bytes, MEMORY_PER_TEXT_BYTE, "body_memo per text byte")
