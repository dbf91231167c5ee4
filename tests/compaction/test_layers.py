"""Each layer as a table: conversation in -> expected view and manifest out."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from proxy.core.compaction import (
    CompactionInput,
    CompactionPolicy,
    CompactionResult,
    Done,
    NeedsSummary,
    PlanCache,
    Removed,
    Summarized,
    SummaryRequest,
    Truncated,
    compact,
    finish,
    run_compaction,
    step,
    truncation_marker,
)
from proxy.core.compaction.bridge import (
    ASSISTANT_SUMMARY_TEXT,
    ASSISTANT_TEXTS_TEXT,
    CARRIED_HEADER,
    SUMMARY_HEADER,
)
from proxy.core.compaction.markers import count_markers
from proxy.core.tokens import TokenCounter
from tests.compaction.invariants import check_view, dumps
from tests.strategies import PNG_2X2

COUNTER = TokenCounter()
Msg = dict[str, Any]

# --- a tiny conversation DSL ------------------------------------------------------------------


def user(*blocks: Any) -> Msg:
    return {"role": "user", "content": list(blocks)}


def assistant(*blocks: Any) -> Msg:
    return {"role": "assistant", "content": list(blocks)}


def system(text: str) -> Msg:
    return {"role": "system", "content": text}


def text(s: str) -> Msg:
    return {"type": "text", "text": s}


def use(uid: str, name: str, **tool_input: Any) -> Msg:
    return {"type": "tool_use", "id": uid, "name": name, "input": tool_input}


def result(uid: str, content: Any = "ok", **extra: Any) -> Msg:
    return {"type": "tool_result", "tool_use_id": uid, "content": content, **extra}


def image() -> Msg:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG_2X2},
    }


def lines(n: int, tag: str = "line") -> str:
    return "\n".join(f"{tag} {i} of the file" for i in range(n))


def interaction(uid: str, name: str, content: Any = "ok", **tool_input: Any) -> list[Msg]:
    return [assistant(use(uid, name, **tool_input)), user(result(uid, content))]


def run(
    messages: list[Msg],
    policy: CompactionPolicy,
    answer: str | None = "SUMMARY",
    plans: PlanCache | None = None,
) -> CompactionResult:
    before = dumps(messages)
    outcome = compact(
        CompactionInput(None, None, messages, "m"),
        policy,
        COUNTER,
        plans if plans is not None else PlanCache(),
        "t",
    )
    while isinstance(outcome, NeedsSummary):
        outcome = step(outcome.continuation, answer)
    res = outcome.result
    assert dumps(messages) == before  # never mutated
    check_view(messages, res.messages)
    return res


# Policies: tiny thresholds so that compaction triggers; a large keep_recent switches L3 off.
def only(**kw: Any) -> CompactionPolicy:
    defaults: dict[str, Any] = dict(
        threshold=100,
        hard_limit=100_000,
        target_ratio=0.1,
        keep_recent=1_000,
        shrink_window=False,
        summarize=False,
    )
    defaults.update(kw)
    return CompactionPolicy(**defaults)


FIRST = user(text("please fix the parser"))
LAST = user(text("thanks, go on"))
DONE = assistant(text("done"))

# --- L1 truncate ------------------------------------------------------------------------------


def test_truncate_cuts_head_and_tail_with_a_marker() -> None:
    big = lines(400)
    messages = [FIRST, *interaction("t1", "Bash", big, command="cat f"), DONE, LAST]
    res = run(messages, only(tool_result_cap=50))
    cut = res.messages[2]["content"][0]["content"]
    assert res.layers == ("truncate",)
    assert cut.startswith("line 0 of the file") and cut.endswith("line 399 of the file")
    assert "[context-proxy: truncated " in cut and " tokens from this tool result]" in cut
    assert len(cut) < len(big) // 4
    [record] = res.manifest
    assert isinstance(record, Truncated)
    assert (record.message_index, record.tool_use_id) == (2, "t1")
    assert record.tokens_before > 1_000 > 100 > record.tokens_after
    assert record.artifact_key is None
    # everything else is the client's objects, by reference
    assert res.messages[1] is messages[1] and res.messages[0] is messages[0]


def test_truncate_list_content_cuts_text_and_keeps_images() -> None:
    img = image()
    messages = [
        FIRST,
        *interaction("t1", "Bash", [text(lines(300)), img, text(lines(100, "tail"))], command="x"),
        DONE,
        LAST,
    ]
    res = run(messages, only(tool_result_cap=40))
    content = res.messages[2]["content"][0]["content"]
    assert [b["type"] for b in content] == ["text", "image", "text"]
    assert content[1] is img
    assert all("[context-proxy: truncated" in b["text"] for b in (content[0], content[2]))
    # the cut is in proportion: the bigger block keeps more
    assert len(content[0]["text"]) > len(content[2]["text"])


def test_truncate_never_touches_the_last_message_or_assistant_blocks() -> None:
    huge_input = use("t1", "Write", file_path="/a", content=lines(500))
    messages = [FIRST, assistant(huge_input), user(result("t1", lines(500)))]
    res = run(messages, only(tool_result_cap=10))
    assert not res.changed and res.messages == messages
    assert res.over_hard_limit is False


def test_truncate_oldest_first_and_stops_under_target() -> None:
    messages = [
        FIRST,
        *interaction("t1", "Bash", lines(200, "old"), command="a"),
        *interaction("t2", "Bash", lines(200, "new"), command="b"),
        DONE,
        LAST,
    ]
    total = run(messages, only(threshold=10_000)).tokens_before
    # the target leaves room for one full result: only the oldest is cut
    policy = only(
        threshold=total - 1, target_ratio=(total - 1_000) / (total - 1), tool_result_cap=30
    )
    res = run(messages, policy)
    assert [(r.message_index, r.tool_use_id) for r in res.manifest if isinstance(r, Truncated)] == [
        (2, "t1")
    ]
    assert len(res.manifest) == 1
    assert res.messages[4] is messages[4]


def test_truncation_marker_names_the_pointer() -> None:
    assert truncation_marker(900, 1000) == (
        "[context-proxy: truncated 900 of 1000 tokens from this tool result]"
    )
    assert truncation_marker(900, 1000, "artifact://abc") == (
        "[context-proxy: truncated 900 of 1000 tokens from this tool result; full text: artifact://abc]"
    )


# --- L2 dedup ---------------------------------------------------------------------------------


def read(uid: str, path: str = "/repo/a.py", **kw: Any) -> list[Msg]:
    return interaction(uid, "Read", lines(30, uid), file_path=path, **kw)


DEDUP_CASES: list[tuple[str, list[Msg], list[int], list[str]]] = [
    # (name, messages, indices of the messages expected to remain, removed tool_use ids)
    (
        "three reads of one path keep the last",
        [FIRST, *read("r1"), *read("r2"), *read("r3"), DONE, LAST],
        [0, 5, 6, 7, 8],
        ["r1", "r2"],
    ),
    (
        "edits are never removed and do not supersede",
        [
            FIRST,
            *read("r1"),
            *interaction("e1", "Edit", file_path="/repo/a.py", old_string="a", new_string="b"),
            *read("r2"),
            DONE,
            LAST,
        ],
        [0, 3, 4, 5, 6, 7, 8],
        ["r1"],
    ),
    (
        "paths are normalised",
        [FIRST, *read("r1", "/repo//./a.py"), *read("r2", "/repo/a.py"), DONE, LAST],
        [0, 3, 4, 5, 6],
        ["r1"],
    ),
    (
        "a partial read does not supersede a whole one; a whole read supersedes a partial one",
        [
            FIRST,
            *read("r1"),
            *read("r2", offset=10),
            *read("r3", offset=5),
            *read("r4"),
            DONE,
            LAST,
        ],
        [0, 7, 8, 9, 10],
        ["r1", "r2", "r3"],
    ),
    (
        "a later read that failed supersedes nothing",
        [
            FIRST,
            *read("r1"),
            assistant(use("r2", "Read", file_path="/repo/a.py")),
            user(result("r2", "no such file", is_error=True)),
            DONE,
            LAST,
        ],
        [0, 1, 2, 3, 4, 5, 6],
        [],
    ),
    (
        "different files and other tool families stay",
        [
            FIRST,
            *read("r1", "/repo/b.py"),
            *interaction("v1", "read_file", path="/repo/a.py"),
            *read("r2", "/repo/a.py"),
            DONE,
            LAST,
        ],
        [0, 1, 2, 3, 4, 5, 6, 7, 8],
        [],
    ),
    (
        "the editor's view is a read, its str_replace is not",
        [
            FIRST,
            *interaction("v1", "str_replace_based_edit_tool", command="view", path="/a"),
            *interaction("s1", "str_replace_based_edit_tool", command="str_replace", path="/a"),
            *interaction("v2", "str_replace_editor", command="view", path="/a"),
            DONE,
            LAST,
        ],
        [0, 3, 4, 5, 6, 7, 8],
        ["v1"],
    ),
    (
        "a read in the latest assistant message supersedes but is never removed",
        [FIRST, *read("r1"), *read("r2")],
        [0, 3, 4],
        ["r1"],
    ),
]


@pytest.mark.parametrize(
    ("messages", "kept", "removed"),
    [c[1:] for c in DEDUP_CASES],
    ids=[c[0] for c in DEDUP_CASES],
)
def test_dedup(messages: list[Msg], kept: list[int], removed: list[str]) -> None:
    res = run(messages, only(tool_result_cap=100_000))
    assert dumps(res.messages) == dumps([messages[i] for i in kept])
    records = [r for r in res.manifest if isinstance(r, Removed)]
    assert [r.tool_use_ids for r in records] == [(uid,) for uid in removed]
    assert all(r.reason == "dedup" and r.tokens > 0 for r in records)
    assert ("dedup" in res.layers) == bool(removed)


def test_dedup_parallel_calls_keep_the_other_blocks() -> None:
    say = text("reading both")
    a1 = assistant(say, use("r1", "Read", file_path="/a"), use("b1", "Bash", command="ls"))
    u1 = user(result("r1", lines(20)), result("b1", "files"))
    messages = [FIRST, a1, u1, *read("r2", "/a"), DONE, LAST]
    res = run(messages, only(tool_result_cap=100_000))
    assert res.messages[1] == assistant(say, use("b1", "Bash", command="ls"))
    assert res.messages[1]["content"][0] is say  # untouched blocks by reference
    assert res.messages[2] == user(result("b1", "files"))
    [record] = res.manifest
    assert isinstance(record, Removed)
    assert record == Removed((), ("r1",), record.tokens, "dedup") and record.tokens > 0


def test_dedup_removes_the_pair_when_the_assistant_is_left_with_thinking_only() -> None:
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "sig"}
    messages = [
        FIRST,
        assistant(thinking, use("r1", "Read", file_path="/a")),
        user(result("r1", lines(20))),
        *read("r2", "/a"),
        DONE,
        LAST,
    ]
    res = run(messages, only(tool_result_cap=100_000))
    assert dumps(res.messages) == dumps([FIRST, *messages[3:]])
    [record] = res.manifest
    assert isinstance(record, Removed) and record.message_indices == (1, 2)


def test_dedup_keeps_a_read_when_the_user_typed_next_to_its_result() -> None:
    messages = [
        FIRST,
        assistant(use("r1", "Read", file_path="/a")),
        user(result("r1", lines(20)), text("also check the tests")),
        *read("r2", "/a"),
        DONE,
        LAST,
    ]
    res = run(messages, only(tool_result_cap=100_000))
    assert not res.changed


# --- L3 prune ---------------------------------------------------------------------------------


def prune(keep_recent: int, **kw: Any) -> CompactionPolicy:
    return only(keep_recent=keep_recent, tool_result_cap=100_000, **kw)


def test_prune_keeps_the_first_message_and_the_recent_window() -> None:
    old = [
        *interaction("b1", "Bash", lines(50), command="a"),
        *interaction("b2", "Bash", lines(50), command="b"),
    ]
    recent = [*interaction("b3", "Bash", "x", command="c"), DONE, LAST]
    messages = [FIRST, *old, *recent]
    res = run(messages, prune(4))
    # nothing typed in the removed turns: no bridge, messages[0] then the window's assistant
    assert dumps(res.messages) == dumps([FIRST, *recent])
    assert res.layers == ("prune",)
    [record] = res.manifest
    assert isinstance(record, Removed) and record.reason == "prune"
    assert record.message_indices == (1, 2, 3, 4) and record.tool_use_ids == ("b1", "b2")


def test_prune_widens_the_window_instead_of_splitting_a_pair() -> None:
    messages = [
        FIRST,
        *interaction("b1", "Bash", lines(50), command="a"),
        *interaction("b2", "Bash", lines(50), command="b"),
        assistant(use("p1", "Bash", command="c"), use("p2", "Bash", command="d")),
        user(result("p1", "1"), result("p2", "2")),
        DONE,
        LAST,
    ]
    # keep_recent=3 would start the window at the tool_result message 6: widen to message 5
    res = run(messages, prune(3))
    assert dumps(res.messages) == dumps([FIRST, *messages[5:]])


def test_prune_carries_user_text_into_the_bridge() -> None:
    typed = "do not touch the tests"
    messages = [
        FIRST,
        assistant(use("b1", "Bash", command="a")),
        user(result("b1", lines(50)), text(typed), image()),
        *interaction("b2", "Bash", lines(50), command="b"),
        DONE,
        LAST,
    ]
    res = run(messages, prune(2))
    assert dumps(res.messages) == dumps(
        [
            FIRST,
            assistant(text(ASSISTANT_TEXTS_TEXT)),
            user(text(f"{CARRIED_HEADER}\n{typed}")),
            DONE,
            LAST,
        ]
    )


def test_prune_keeps_system_entries_after_the_bridge() -> None:
    rule = system("answer in French")
    messages = [
        FIRST,
        assistant(text("ok")),
        user(text("and now?")),  # a plain user turn in a removed interaction: carried too
        rule,
        *interaction("b1", "Bash", lines(50), command="a"),
        DONE,
        LAST,
    ]
    res = run(messages, prune(2))
    assert dumps(res.messages) == dumps(
        [
            FIRST,
            assistant(text(ASSISTANT_TEXTS_TEXT)),
            user(text(f"{CARRIED_HEADER}\nand now?")),
            rule,
            DONE,
            LAST,
        ]
    )
    assert res.messages[3] is rule


def test_prune_keeps_system_entries_right_after_the_first_message_without_a_bridge() -> None:
    rule = system("answer in French")
    messages = [
        FIRST,
        *interaction("b1", "Bash", lines(50), command="a"),
        rule,
        *interaction("b2", "Bash", lines(50), command="b"),
        DONE,
        LAST,
    ]
    res = run(messages, prune(2))
    assert dumps(res.messages) == dumps([FIRST, rule, DONE, LAST])


def test_prune_never_removes_a_compaction_block_or_what_precedes_it() -> None:
    compaction = {"type": "compaction", "content": "earlier", "encrypted_content": "E"}
    messages = [
        FIRST,
        *interaction("b1", "Bash", lines(50), command="a"),
        assistant(compaction, text("continuing")),
        user(text("go")),
        *interaction("b2", "Bash", lines(50), command="b"),
        *interaction("b3", "Bash", lines(50), command="c"),
        DONE,
        LAST,
    ]
    res = run(messages, only(keep_recent=2, tool_result_cap=10))
    assert dumps(res.messages[:5]) == dumps(messages[:5])  # up to the compaction, untouched
    assert res.messages[5:] == [DONE, LAST]
    # and L1 did not cut the result before the compaction block either
    assert all(r.message_index > 3 for r in res.manifest if isinstance(r, Truncated))


# --- L4 summarize -----------------------------------------------------------------------------


def test_summary_request_and_bridge() -> None:
    secret_image = image()
    messages = [
        FIRST,
        assistant(text("let me look"), use("r1", "Read", file_path="/repo/a.py")),
        user(result("r1", [text(lines(200)), secret_image])),
        *interaction("b1", "Bash", "boom", command="make", is_error=True),
        DONE,
        LAST,
    ]
    policy = only(keep_recent=2, summarize=True, summary_tool_result_cap=20, summary_max_tokens=100)
    outcome = compact(CompactionInput(None, None, messages, "m"), policy, COUNTER, PlanCache(), "t")
    assert isinstance(outcome, NeedsSummary)
    req = outcome.summary_request
    assert (req.model, req.max_tokens) == ("claude-haiku-4-5", 100)
    assert "hand-off" in req.system
    assert req.body()["messages"] == [{"role": "user", "content": req.text}]
    assert 'tool_use Read({"file_path":"/repo/a.py"})' in req.text
    assert "ASSISTANT:\nlet me look" in req.text
    assert "[image]" in req.text and PNG_2X2 not in req.text
    assert "tokens of this result cut]" in req.text  # each result capped for the summariser
    assert "line 0 of the file" in req.text and "line 199 of the file" in req.text
    res = finish(outcome.continuation, "  the user wants the parser fixed  ")
    assert dumps(res.messages) == dumps(
        [
            FIRST,
            assistant(text(ASSISTANT_SUMMARY_TEXT)),
            user(text(f"{SUMMARY_HEADER}\n<summary>\nthe user wants the parser fixed\n</summary>")),
            DONE,
            LAST,
        ]
    )
    assert res.layers == ("summarize",) and res.summary_status == "ok"
    [record] = res.manifest
    assert isinstance(record, Summarized)
    assert record.message_indices == (1, 2, 3, 4) and record.tool_use_ids == ("r1", "b1")
    check_view(messages, res.messages)


@pytest.mark.parametrize("answer", [None, "", " \n\t"])
def test_failed_summary_keeps_the_pruned_view(answer: str | None) -> None:
    messages = [FIRST, *interaction("b1", "Bash", lines(50), command="a"), DONE, LAST]
    res = run(messages, only(keep_recent=2, summarize=True, summary_max_tokens=100), answer)
    assert res.summary_status == "failed" and res.layers == ("prune",)
    assert dumps(res.messages) == dumps([FIRST, DONE, LAST])


def test_summariser_input_is_chunked_never_cut() -> None:
    """Over the input budget, the removed region is summarised as a chain of calls, each
    within the budget, and every removed message reaches one of them."""
    messages = [FIRST]
    for i in range(60):
        messages += interaction(f"b{i}", "Bash", lines(40, f"out{i}"), command=f"step {i}")
    messages += [DONE, LAST]
    policy = only(keep_recent=2, summarize=True, summary_input_cap=1_500, summary_max_tokens=200)
    outcome = compact(CompactionInput(None, None, messages, "m"), policy, COUNTER, PlanCache(), "t")
    texts: list[str] = []
    while isinstance(outcome, NeedsSummary):
        text = outcome.summary_request.text
        assert COUNTER.count_text(text) <= 1_500
        if texts:  # each later call reads what the previous one wrote
            assert f"<previous_summary>\nsummary {len(texts)}\n</previous_summary>" in text
        texts.append(text)
        outcome = step(outcome.continuation, f"summary {len(texts)}")
    res = outcome.result
    assert 1 < len(texts) <= policy.summary_max_calls
    joined = "\n".join(texts)
    assert "omitted" not in joined
    for i in range(60):
        assert f'"command":"step {i}"' in joined
    # every removed message, by its index in the client's messages, in exactly one call
    labels = [int(x) for x in re.findall(r"^\[#(\d+)\] (?:USER|ASSISTANT):", joined, re.M)]
    [record] = [r for r in res.manifest if isinstance(r, Summarized)]
    assert sorted(labels) == list(record.message_indices) == list(range(1, 121))
    assert record.calls == len(texts) == res.summary_calls
    assert res.summary_status == "ok"
    assert "summary " + str(len(texts)) in dumps(res.messages).decode()


def test_a_summary_chain_is_bounded_and_a_failure_anywhere_fails_it() -> None:
    messages = [FIRST]
    for i in range(60):
        messages += interaction(f"b{i}", "Bash", lines(40, f"out{i}"), command=f"step {i}")
    messages += [DONE, LAST]
    policy = only(
        keep_recent=2,
        summarize=True,
        summary_input_cap=700,
        summary_max_tokens=100,
        summary_max_calls=3,
    )
    outcome = compact(CompactionInput(None, None, messages, "m"), policy, COUNTER, PlanCache(), "t")
    assert isinstance(outcome, NeedsSummary)
    assert outcome.continuation.calls == 3  # caps shrank rather than a message being left out
    seen: list[int] = []
    for _ in range(2):
        assert isinstance(outcome, NeedsSummary)
        seen += outcome.continuation.origins
        with pytest.raises(ValueError, match="more call"):
            finish(outcome.continuation, "partial")
        outcome = step(outcome.continuation, "partial")
    assert isinstance(outcome, NeedsSummary)
    seen += outcome.continuation.origins
    assert seen == list(range(1, 121))
    failed = finish(outcome.continuation, None)  # the third call fails: no half summary
    assert failed.summary_status == "failed" and failed.summary_calls == 3
    assert "partial" not in dumps(failed.messages).decode()


# --- cache_control ----------------------------------------------------------------------------


def marked(block: Msg) -> Msg:
    return {**block, "cache_control": {"type": "ephemeral"}}


def test_more_than_four_markers_are_capped_in_a_changed_view() -> None:
    messages = [
        user(marked(text("first"))),
        assistant(marked(use("b1", "Bash", command="a"))),
        user(marked(result("b1", lines(300)))),
        assistant(marked(text("reply"))),
        user(marked(text("again"))),
        assistant(text("sure")),
        user(marked(text("last"))),
    ]
    assert count_markers(None, None, messages) == 6
    res = run(messages, only(tool_result_cap=20))
    assert res.changed
    assert count_markers(None, None, res.messages) == 4
    assert res.messages[-1] is messages[-1]  # the client's last marker survives
    assert res.messages[0] is messages[0]  # messages[0] is never touched
    # the earliest others went first; the cut result, the reply and the last one keep theirs
    assert [("cache_control" in m["content"][0]) for m in res.messages] == [
        True,
        False,
        False,
        True,
        True,
        False,
        True,
    ]


def test_markers_are_left_alone_when_nothing_changes() -> None:
    messages = [
        user(marked(text(f"m{i}"))) if i % 2 == 0 else assistant(marked(text("a")))
        for i in range(7)
    ]
    res = run(messages, only(threshold=100_000))
    assert not res.changed and res.messages == messages


def test_markers_follow_the_current_request_on_a_reused_plan() -> None:
    """Claude Code moves its breakpoints every turn: the plan still matches, and the view carries
    this request's markers, not the ones the plan was made with."""
    call = assistant(use("b1", "Bash", command="a"))
    turn1 = [FIRST, call, user(marked(result("b1", lines(300)))), DONE, user(marked(text("one")))]
    plans = PlanCache()
    first = run(turn1, only(tool_result_cap=20), plans=plans)
    assert first.plan_status == "new"
    assert "cache_control" in first.messages[2]["content"][0]  # kept on the cut result
    turn2 = [
        FIRST,
        call,
        user(result("b1", lines(300))),  # the client moved this marker...
        DONE,
        user(text("one")),
        assistant(text("two")),
        user(marked(text("three"))),  # ...to here
    ]
    second = run(turn2, only(threshold=100_000, tool_result_cap=20), plans=plans)
    assert second.plan_status == "reused"
    assert count_markers(None, None, second.messages) == 1
    assert second.messages[-1] is turn2[-1]
    cut = first.messages[2]["content"][0]
    assert second.messages[2]["content"][0] == {
        k: v for k, v in cut.items() if k != "cache_control"
    }


def test_markers_inside_a_cut_tool_result_stay_on_their_block() -> None:
    content = [marked(text(lines(300))), image()]
    messages = [FIRST, *interaction("b1", "Bash", content, command="a"), DONE, LAST]
    res = run(messages, only(tool_result_cap=20))
    [block, img] = res.messages[2]["content"][0]["content"]
    assert "[context-proxy: truncated" in block["text"]
    assert block["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in img


def test_the_latest_assistant_message_is_never_deduplicated() -> None:
    """Two reads of one file in the latest assistant message (the later one supersedes the
    earlier), answered by a message that is not the last one."""
    latest = assistant(use("r1", "Read", file_path="/a"), use("r2", "Read", file_path="/a"))
    messages = [
        FIRST,
        *interaction("b1", "Bash", lines(100), command="a"),
        latest,
        user(result("r1", lines(100)), result("r2", lines(100))),
        user(text("and one more thing")),  # consecutive user messages: the provider merges them
    ]
    outcome = compact(
        CompactionInput(None, None, messages, "m"),
        only(tool_result_cap=100_000),
        COUNTER,
        PlanCache(),
        "t",
    )
    assert isinstance(outcome, Done)
    assert outcome.result.messages[3] is latest
    assert outcome.result.messages[4] is messages[4]


# --- pipeline ---------------------------------------------------------------------------------


def test_nothing_happens_at_or_under_the_threshold() -> None:
    messages = [FIRST, *interaction("b1", "Bash", lines(300), command="a"), DONE, LAST]
    total = run(messages, only(threshold=100_000)).tokens_before
    res = run(messages, only(threshold=total, tool_result_cap=10))
    assert not res.changed and res.layers == () and res.plan_status == "none"
    assert res.messages == messages and res.compaction_id is None
    assert run(messages, only(threshold=total - 1, tool_result_cap=10)).changed


def test_calibration_scales_the_comparison() -> None:
    messages = [FIRST, *interaction("b1", "Bash", lines(300), command="a"), DONE, LAST]
    total = run(messages, only(threshold=100_000)).tokens_before
    policy = only(threshold=total + 10, tool_result_cap=10)
    plain = compact(CompactionInput(None, None, messages, "m"), policy, COUNTER, PlanCache(), "t")
    scaled = compact(
        CompactionInput(None, None, messages, "m", calibration=1.5),
        policy,
        COUNTER,
        PlanCache(),
        "t",
    )
    assert isinstance(plain, Done) and not plain.result.changed
    assert isinstance(scaled, Done) and scaled.result.changed
    assert scaled.result.tokens_before == round(total * 1.5)


def test_over_hard_limit_when_the_window_alone_is_too_big() -> None:
    messages = [
        FIRST,
        assistant(use("w", "Write", file_path="/a", content=lines(2_000))),
        user(result("w", "ok")),
    ]
    res = run(messages, only(threshold=200, hard_limit=300))
    assert res.over_hard_limit and res.tokens_after > 300


def test_an_invalid_conversation_is_never_rewritten() -> None:
    messages = [
        FIRST,
        assistant(use("b1", "Bash", command="a")),
        user(text("no result")),
        assistant(text("x")),
        user(result("zz", lines(300))),
    ]
    outcome = compact(
        CompactionInput(None, None, messages, "m"),
        only(tool_result_cap=10),
        COUNTER,
        PlanCache(),
        "t",
    )
    assert isinstance(outcome, Done) and not outcome.result.changed


def test_compaction_id_is_deterministic_and_tenant_bound() -> None:
    messages = [FIRST, *interaction("b1", "Bash", lines(300), command="a"), DONE, LAST]
    policy = only(tool_result_cap=10)

    def cid(tenant: str) -> str | None:
        outcome = compact(
            CompactionInput(None, None, messages, "m"), policy, TokenCounter(), PlanCache(), tenant
        )
        assert isinstance(outcome, Done)
        return outcome.result.compaction_id

    assert cid("a") == cid("a") != cid("b")
    assert orjson.loads(orjson.dumps(cid("a"))) == cid("a")


async def test_run_compaction_calls_the_summariser_only_when_needed() -> None:
    calls: list[SummaryRequest] = []

    async def summarize(request: SummaryRequest) -> str | None:
        calls.append(request)
        return "the gist"

    messages = [FIRST, *interaction("b1", "Bash", lines(50), command="a"), DONE, LAST]
    policy = only(keep_recent=2, summarize=True, summary_max_tokens=100)
    res = await run_compaction(
        CompactionInput(None, None, messages, "m"), policy, COUNTER, PlanCache(), "t", summarize
    )
    assert len(calls) == 1 and res.summary_status == "ok"
    assert "<summary>\nthe gist\n</summary>" in res.messages[2]["content"][0]["text"]
    quiet = await run_compaction(
        CompactionInput(None, None, messages, "m"),
        only(threshold=100_000),
        COUNTER,
        PlanCache(),
        "t",
        summarize,
    )
    assert len(calls) == 1 and not quiet.changed


@pytest.mark.parametrize(
    "bad",
    [
        {"threshold": 0},
        {"threshold": 100, "hard_limit": 99},
        {"target_ratio": 0.0},
        {"target_ratio": 1.5},
        {"keep_recent": 0},
        {"summary_prompt": "  "},
    ],
)
def test_policy_is_validated_once(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="invalid compaction policy"):
        CompactionPolicy(**bad)
