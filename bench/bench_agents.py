#!/usr/bin/env python
"""Figures for "one session, many agents" and "thinking that stays valid" (issue 20).

    python bench/bench_agents.py [--turns 24] [--json out.json]

Everything runs in one process: the fake upstream (tests/upstream.py) playing the provider by its
published rules (tests/provider_rules: thinking blocks bound to their prefix, signed), the proxy
(tests/harness.ProxyServer, a real SQLite store), the official SDK as the client.

1. **Conversations.** One session, three conversations interleaved turn by turn -- the main one,
   a subagent ``a1``, a nested ``a2`` (Claude Code's headers) -- each a tool loop with long
   results and Claude Code's moving ``cache_control`` marker, until each is compacted. Counted:
   the conversations offered ``context_proxy_retrieve`` after their compaction; every pointer a
   bridge names, and those naming another conversation's event; the pointers each conversation's
   model redeems (one of its own, one of another's), and those that returned another
   conversation's event.
2. **Thinking.** A ``--turns``-turn tool loop on a binding model (Claude Fable 5.1, thinking on,
   a durable fact added a third of the way in), JSON and SSE, through a compacting proxy; and the
   same loop on a model that does not bind. Counted: stale-thinking 400s; blocks the provider
   dropped that were made under the view the proxy forwards (still-valid blocks lost); blocks
   dropped on the non-binding model; whether the proxy's ``x-compaction-thinking`` count equals
   what the provider dropped, turn by turn.

The goals are the issue's: 0 cross-conversation redemptions, every conversation offered the tool,
0 stale-thinking 400s, 0 still-valid blocks lost, 0 blocks dropped on a non-binding model.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.harness import LoopThread  # noqa: E402
from tests.provider_rules import ProviderRules  # noqa: E402
from tests.test_conversations import (  # noqa: E402
    CONVERSATIONS,
    SESSION,
    Model,
    _bridge_pointers,
    _run,
    conversations_proxy,
)
from tests.upstream import FakeUpstream  # noqa: E402


def conversations(loop: LoopThread) -> dict[str, Any]:
    from proxy.core.compaction.retrieval import TOOL
    from proxy.core.pointers import TranscriptPointer, parse_pointer
    from proxy.server.appkeys import DURABLE
    from tests.test_conversations import _who

    with tempfile.TemporaryDirectory() as tmp:
        upstream = FakeUpstream()
        loop.run(upstream.start())
        proxy = conversations_proxy(loop, upstream, Path(tmp))
        try:
            model = Model()
            model.foreign = {"main": f"transcript:{SESSION}:a1:2", "a1": f"transcript:{SESSION}:2",
                             "a2": f"transcript:{SESSION}:a1:3"}
            upstream.script(*[model] * 1000)
            _run(proxy, model)
            loop.run(proxy.app[DURABLE].drain())
            offered = sorted({
                _who(r) for r in upstream.requests
                if r.path == "/v1/messages" and r.json().get("tools", [])[-1:] == [TOOL]
            })
            named = crossing = 0
            for r in upstream.requests:
                if r.path != "/v1/messages":
                    continue
                agent = "" if _who(r) == "main" else _who(r)
                for text in _bridge_pointers(r.json()):
                    pointer = parse_pointer(text)
                    assert isinstance(pointer, TranscriptPointer)
                    named += 1
                    crossing += (pointer.session, pointer.agent) != (SESSION, agent)
            redeemed_own = sum(1 for name in CONVERSATIONS if model.results.get(name) and f"[{name}" in model.results[name][0])
            cross_redeemed = sum(
                1 for name, texts in model.results.items() for text in texts[1:] if "denied" not in text
            )
            cross_asked = sum(1 for texts in model.results.values() if len(texts) > 1)
            return {
                "conversations": list(CONVERSATIONS),
                "offered_retrieval_after_compaction": offered,
                "bridge_pointers_named": named,
                "bridge_pointers_naming_another_conversation": crossing,
                "own_pointer_redeemed_with_own_event": redeemed_own,
                "cross_conversation_redemptions_tried": cross_asked,
                "pointers_redeemed_across_conversations": cross_redeemed,
            }
        finally:
            loop.run(proxy.stop())
            loop.run(upstream.stop())


def thinking(loop: LoopThread, turns: int, model: str, stream: bool) -> dict[str, Any]:
    import tests.test_thinking_binding as tb

    with tempfile.TemporaryDirectory() as tmp:
        upstream = FakeUpstream()
        loop.run(upstream.start())
        upstream.use_rules(ProviderRules())
        proxy = tb.binding_proxy(loop, upstream, Path(tmp))
        try:
            chat = tb.Loop(tb._client(proxy), upstream, model=model, stream=stream)
            made_at: dict[str, int] = {}
            errors = 0
            for k in range(turns):
                if k == turns // 3:
                    tb._add_fact(proxy)
                try:
                    message = chat.step(k)
                except Exception:  # a 400 from the provider: counted, and the loop ends
                    errors += 1
                    break
                for sig in tb._signatures(message):
                    made_at[sig] = k
            stale_400 = sum(
                1 for v in upstream.verdicts
                if v.rejection is not None and "bound to a different conversation" in v.rejection.message
            )
            changes = [k for k, h in enumerate(chat.headers) if h.get("x-compaction-plan") == "new"] + [turns // 3]
            verdicts = [v for v, r in zip(upstream.verdicts, upstream.requests, strict=False) if r.json().get("model") != tb.SUMMARY_MODEL]
            forwarded = tb._forwarded(upstream)
            dropped = lost = header_mismatch = 0
            for k, (request, verdict) in enumerate(zip(forwarded, verdicts, strict=False)):
                body = request.json()
                since = max((c for c in changes if c <= k), default=-1)
                for path in verdict.dropped:
                    _, i, _, j = path.split(".")
                    block = body["messages"][int(i)]["content"][int(j)]
                    dropped += 1
                    lost += made_at.get(block.get("signature") or block.get("data"), -1) >= since
                if k < len(chat.headers):
                    count = int(chat.headers[k].get("x-compaction-thinking", "none=0").split("=")[1])
                    header_mismatch += count != len(verdict.dropped)
            plans = [h.get("x-compaction-plan") for h in chat.headers]
            return {
                "model": model,
                "stream": stream,
                "turns": len(chat.headers),
                "new_plans": plans.count("new"),
                "reused_plans": plans.count("reused"),
                "provider_errors": errors,
                "stale_thinking_400s": stale_400,
                "blocks_dropped_by_the_provider": dropped,
                "still_valid_blocks_lost": lost,
                "turns_where_the_header_count_differs": header_mismatch,
            }
        finally:
            loop.run(proxy.stop())
            loop.run(upstream.stop())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=24)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    loop = LoopThread()
    try:
        figures: dict[str, Any] = {"conversations": conversations(loop), "thinking": []}
        for model in ("claude-fable-5-1", "claude-opus-4-8"):
            for stream in (False, True):
                figures["thinking"].append(thinking(loop, args.turns, model, stream))
    finally:
        loop.close()
    c = figures["conversations"]
    print("one session, three conversations (main, a1, nested a2), interleaved, each compacted")
    print(f"  retrieval offered after compaction to: {', '.join(c['offered_retrieval_after_compaction'])}")
    print(f"  bridge pointers named: {c['bridge_pointers_named']}, naming another conversation: {c['bridge_pointers_naming_another_conversation']}")
    print(f"  own pointer redeemed with own event: {c['own_pointer_redeemed_with_own_event']} of {len(c['conversations'])}")
    print(f"  pointers redeemed across conversations: {c['pointers_redeemed_across_conversations']} (of {c['cross_conversation_redemptions_tried']} tried)")
    print("thinking blocks bound to their prefix (the provider's published rules)")
    print(f"  {'model':18} {'stream':6} {'turns':>5} {'new':>4} {'reused':>6} {'400s':>5} {'dropped':>7} {'valid lost':>10} {'header off':>10}")
    for t in figures["thinking"]:
        print(f"  {t['model']:18} {('sse' if t['stream'] else 'json'):6} {t['turns']:>5} {t['new_plans']:>4} {t['reused_plans']:>6}"
              f" {t['stale_thinking_400s']:>5} {t['blocks_dropped_by_the_provider']:>7} {t['still_valid_blocks_lost']:>10}"
              f" {t['turns_where_the_header_count_differs']:>10}")
    goals = {
        "pointers redeemed across conversations = 0": c["pointers_redeemed_across_conversations"] == 0,
        "retrieval offered to every conversation": c["offered_retrieval_after_compaction"] == sorted(c["conversations"]),
        "stale-thinking 400s = 0": all(t["stale_thinking_400s"] == 0 and t["provider_errors"] == 0 for t in figures["thinking"]),
        "still-valid blocks lost = 0": all(t["still_valid_blocks_lost"] == 0 for t in figures["thinking"]),
        "blocks dropped on a non-binding model = 0": all(
            t["blocks_dropped_by_the_provider"] == 0 for t in figures["thinking"] if t["model"] != "claude-fable-5-1"
        ),
    }
    figures["goals"] = goals
    print("goals: " + "; ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in goals.items()))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
