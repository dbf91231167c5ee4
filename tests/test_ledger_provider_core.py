"""What a call is billed for when the provider lists ``usage.iterations`` (proxy.core.provider_usage),
the bounded notes of its applied edits and input transformations (proxy.core.provider_notes), and
the usage tap reading both from what the relay writes. Tables and properties.

The shapes are the SDK 2.16 beta types' (``BetaUsage.iterations``: "A `compaction` entry's tokens
are not included in the top-level `usage` fields"; ``BetaRawMessageDeltaEvent.context_management``
and ``.input_transformations``; ``BetaMessage.input_transformations``) and the figures of the
provider's "Compaction at a token threshold" example.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.ledger import Price, Usage, cost_of, merge_usage, row_sums, savings_of
from proxy.core.provider_notes import MAX_ENTRIES, MAX_TEXT, ProviderNotes, notes_from
from proxy.core.provider_usage import billing, has_compaction
from proxy.server.relay.usage import UsageTap
from tests.upstream import frame

SONNET = Price.standard(3, 15)


def it(kind: str, inp: int, out: int, read: int = 0, write: int = 0, **split: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": kind, "input_tokens": inp, "cache_creation_input_tokens": write,
                             "cache_read_input_tokens": read, "output_tokens": out}
    if split:
        entry["cache_creation"] = {f"ephemeral_{k}_input_tokens": v for k, v in split.items()}
    return entry


TOP = {"input_tokens": 23000, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1000}


@pytest.mark.parametrize(
    "raw, billed, compaction, compactions",
    [
        # no iterations: the top-level figures, as before
        (TOP, Usage(23000, 0, None, None, 0, 1000), None, 0),
        ({**TOP, "iterations": []}, Usage(23000, 0, None, None, 0, 1000), None, 0),
        ({**TOP, "iterations": [None, "x"]}, Usage(23000, 0, None, None, 0, 1000), None, 0),
        # the docs' example: the compaction entry is not in the top-level figures; the message one is
        ({**TOP, "iterations": [it("compaction", 180000, 3500), it("message", 23000, 1000)]},
         Usage(203000, 0, None, None, 0, 4500), Usage(180000, 0, None, None, 0, 3500), 1),
        # a list of compaction entries only: the top-level figures stand for the message
        ({**TOP, "iterations": [it("compaction", 180000, 3500)]},
         Usage(203000, 0, None, None, 0, 4500), Usage(180000, 0, None, None, 0, 3500), 1),
        # on-demand compaction: top-level 0, the cost in one compaction entry
        ({"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 0,
          "iterations": [it("compaction", 150000, 2000, read=20000)]},
         Usage(150000, 0, None, None, 20000, 2000), Usage(150000, 0, None, None, 20000, 2000), 1),
        # a server-side tool loop (two message entries) and two compactions; the cache splits add up
        ({"input_tokens": 1, "output_tokens": 1,
          "iterations": [it("message", 10, 20, read=100, write=50, **{"5m": 50, "1h": 0}),
                         it("compaction", 30, 40, read=1000, write=200, **{"5m": 0, "1h": 200}),
                         it("message", 5, 6, read=300, write=70, **{"1h": 70}),
                         it("compaction", 1, 2)]},
         Usage(46, 320, 50, 270, 1400, 68), Usage(31, 200, 0, 200, 1000, 42), 2),
        # advisor and fallback entries are sampling steps like message entries
        ({**TOP, "iterations": [it("advisor_message", 700, 70), it("fallback_message", 23000, 1000)]},
         Usage(23700, 0, None, None, 0, 1070), None, 0),
        # entries reporting no figure are no entries
        ({**TOP, "iterations": [{"type": "compaction"}, {"type": "message", "output_tokens": None}]},
         Usage(23000, 0, None, None, 0, 1000), None, 0),
        # junk figures count as missing (0 once iterations are summed)
        ({**TOP, "iterations": [{"type": "message", "input_tokens": True, "output_tokens": -3}, it("message", 9, 9)]},
         Usage(9, 0, None, None, 0, 9), None, 0),
    ],
)
def test_billing_table(raw: dict[str, Any], billed: Usage, compaction: Usage | None, compactions: int) -> None:
    frozen = copy.deepcopy(raw)
    got = billing(raw)
    assert (got.usage, got.compaction, got.compactions) == (billed, compaction, compactions)
    assert raw == frozen  # never changed
    assert has_compaction(raw) == (compactions > 0)


def test_nothing_reported_bills_nothing() -> None:
    assert billing(None).usage is None and billing([]).usage is None
    assert billing({"iterations": [{"type": "message"}]}).usage is None
    assert billing({"service_tier": "standard"}).usage is None


figures = st.one_of(st.none(), st.integers(0, 10**7))
KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")


@st.composite
def entries(draw: st.DrawFn, kind: st.SearchStrategy[str]) -> dict[str, Any]:
    """An entry reporting at least its input (the SDK's types require all four figures)."""
    return {"type": draw(kind), **{k: draw(figures) for k in KEYS}, "input_tokens": draw(st.integers(0, 10**7))}


@given(
    st.dictionaries(st.sampled_from(KEYS), figures),
    st.lists(entries(st.sampled_from(["message", "advisor_message", "fallback_message"])), min_size=1, max_size=4),
    st.lists(entries(st.just("compaction")), max_size=3),
    st.randoms(),
)
def test_with_a_sampling_entry_every_token_is_billed_exactly_once(
    top: dict[str, Any], sampled: list[dict[str, Any]], compacted: list[dict[str, Any]], order: Any
) -> None:
    """Whatever the top-level figures say, the bill is the sum of every entry; the compaction
    share is the sum of the compaction entries."""
    listed = sampled + compacted
    order.shuffle(listed)
    got = billing({**top, "iterations": listed})
    for key, field in zip(KEYS, ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
                                  "output_tokens"), strict=True):
        assert got.usage is not None
        assert getattr(got.usage, field) == sum(e[key] or 0 for e in listed)
        if compacted:
            assert got.compaction is not None
            assert getattr(got.compaction, field) == sum(e[key] or 0 for e in compacted)
    assert got.compactions == len(compacted)


def test_a_stream_keeps_the_last_iterations_list_whole() -> None:
    start = {"input_tokens": 5, "output_tokens": 1, "iterations": [it("message", 5, 1)]}
    frozen = copy.deepcopy(start)
    first = [it("compaction", 100, 10), it("message", 5, 50)]
    merged = merge_usage(start, {"output_tokens": 50, "iterations": first})
    merged = merge_usage(merged, {"output_tokens": 80, "iterations": None})  # null: the last one stays
    assert merged["iterations"] == first
    final = [it("compaction", 100, 10)]  # a shorter list replaces, never merged entry by entry
    merged = merge_usage(merged, {"output_tokens": 90, "iterations": final})
    assert merged == {"input_tokens": 5, "output_tokens": 90, "iterations": final}
    merged["iterations"].append("x")
    assert final == [it("compaction", 100, 10)] and start == frozen  # no list shared with the inputs


def test_savings_use_what_the_answer_was_sampled_from() -> None:
    """The compaction iterations' reads are not the prompt the proxy's compaction shrank."""
    billed = Usage(105, 5000, 2000, 3000, 190000, 3300)
    compaction = Usage(100, 3000, 0, 3000, 150000, 2500)
    sums = row_sums(kind="client", status=200, usage=billed, tokens_before=200_000, tokens_after=100_000,
                    plan="new", summary="ok", compaction_id="c1", provider_compaction=compaction,
                    provider_compactions=1)
    # sent: 5 in + 2,000 written + 40,000 read; removed = 100k/100k x that, 40,000 of it at the read price
    assert savings_of(sums, SONNET) == pytest.approx((40000 * 0.30 + 2005 * 3) / 1e6)
    assert cost_of(sums, SONNET).total == pytest.approx(
        (105 * 3 + 2000 * 3.75 + 3000 * 6 + 190000 * 0.30 + 3300 * 15) / 1e6
    )


# -- notes -------------------------------------------------------------------------------------------


def test_notes_are_absent_without_entries() -> None:
    for cm, tr in ((None, None), ({}, []), ({"applied_edits": []}, None), ({"applied_edits": None}, "x"),
                   ("context", {"type": "thinking_dropped"})):
        assert notes_from(cm, tr) is None


def test_notes_are_bounded_and_count_every_dropped_block() -> None:
    long = "p" * 1000
    changes = [{"type": "thinking_dropped" if i % 3 else "thinking_mismatch_allowed", "path": long,
                "reason": "prefix_binding_mismatch", "deep": {"a": {"b": {"c": {"d": 1}}}},
                "many": list(range(40))} for i in range(100)]
    frozen = copy.deepcopy(changes)
    notes = notes_from({"applied_edits": [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 3,
                                           "cleared_input_tokens": 9000}]}, changes)
    assert notes is not None and changes == frozen
    assert notes.input_transformations_total == 100
    assert notes.thinking_blocks_dropped == sum(1 for i in range(100) if i % 3)  # all of them, cut or not
    kept = notes.input_transformations
    assert kept is not None and 0 < len(kept) <= MAX_ENTRIES
    assert all(len(e["path"]) == MAX_TEXT and len(e["many"]) == 16 for e in kept)
    assert kept[0]["deep"] == {"a": {"b": None}}  # three levels below the entry, then cut
    out = notes.to_json()
    assert out["input_transformations_total"] == 100 and "applied_edits_total" not in out
    assert len(orjson.dumps(out)) <= 33 * 1024
    assert ProviderNotes.from_json(orjson.loads(orjson.dumps(out)), notes.thinking_blocks_dropped) == notes


def test_64_entries_at_most() -> None:
    edits = [{"type": "clear_thinking_20251015", "cleared_thinking_turns": i} for i in range(70)]
    notes = notes_from({"applied_edits": edits}, None)
    assert notes is not None and notes.applied_edits == tuple(edits[:64])
    assert notes.to_json() == {"applied_edits": edits[:64], "applied_edits_total": 70}
    assert notes.input_transformations is None and notes.thinking_blocks_dropped == 0


# -- the tap -----------------------------------------------------------------------------------------

DROPPED = [{"type": "thinking_dropped", "path": "messages.3.content.0", "reason": "prefix_binding_mismatch"}]
EDIT = [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2, "cleared_input_tokens": 700}]


def _start(**message: Any) -> bytes:
    body = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1, "cache_read_input_tokens": 7}, **message}
    return frame("message_start", {"type": "message_start", "message": body})


def _delta(**fields: Any) -> bytes:
    return frame("message_delta", {"type": "message_delta", "delta": {"stop_reason": None}, **fields})


def test_the_tap_reads_notes_from_message_start_and_the_last_message_delta() -> None:
    tap = UsageTap(sse=True)
    text = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta",
            "text": 'event: message_delta\ndata: {"context_management": {"applied_edits": [1]}}'}}
    tap.feed(_start(input_transformations=DROPPED))
    tap.feed(frame("content_block_delta", text))  # text that looks like an event is not one
    tap.feed(_delta(usage={"output_tokens": 3}, context_management={"applied_edits": [{"type": "old"}]}))
    tap.feed(_delta(usage={"output_tokens": 9}, context_management={"applied_edits": EDIT}))
    tap.feed(_delta(usage={"output_tokens": 11}, context_management=None))  # null: the last stays
    assert tap.notes == ProviderNotes(tuple(EDIT), tuple(DROPPED), 1, 1, 1)
    assert tap.usage == {"input_tokens": 10, "output_tokens": 11, "cache_read_input_tokens": 7}
    assert tap.input_tokens == 17


def test_a_message_delta_transformations_list_replaces_message_starts() -> None:
    """The SDK's accumulator: "only sent on `message_delta` after a mid-stream fallback, in which
    case it replaces the `message_start` value"."""
    later = [{"type": "thinking_mismatch_allowed", "path": "messages.1.content.0", "reason": "prefix_binding_mismatch"}]
    tap = UsageTap(sse=True)
    tap.feed(_start(input_transformations=DROPPED) + _delta(usage={"output_tokens": 2}, input_transformations=later))
    assert tap.notes == ProviderNotes(None, tuple(later), 0, 1, 0)


def test_the_tap_reads_notes_of_a_json_message() -> None:
    body = {"type": "message", "content": [], "usage": {"input_tokens": 4, "output_tokens": 2},
            "context_management": {"applied_edits": EDIT}, "input_transformations": DROPPED}
    tap = UsageTap(sse=False)
    raw = orjson.dumps(body)
    tap.feed(raw[:15])
    tap.feed(raw[15:])
    assert tap.notes is None  # nothing before the body is whole
    tap.close()
    assert tap.notes == ProviderNotes(tuple(EDIT), tuple(DROPPED), 1, 1, 1)
    plain = UsageTap(sse=False)
    plain.feed(orjson.dumps({**body, "context_management": None, "input_transformations": []}))
    plain.close()
    assert plain.notes is None and plain.input_tokens == 4


def test_no_input_size_is_learnt_from_an_answer_the_provider_compacted() -> None:
    compacted = {"input_tokens": 23000, "output_tokens": 1000,
                 "iterations": [it("compaction", 180000, 3500), it("message", 23000, 1000)]}
    body = UsageTap(sse=False)
    body.feed(orjson.dumps({"type": "message", "usage": compacted}))
    body.close()
    assert body.usage == compacted and body.input_tokens is None
    stream = UsageTap(sse=True)
    stream.feed(_start())
    assert stream.input_tokens == 17
    stream.feed(_delta(usage={"output_tokens": 1000, "iterations": compacted["iterations"]}))
    assert stream.input_tokens is None
