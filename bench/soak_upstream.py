"""The fake upstreams of bench/bench_soak.py, in their own process: the Anthropic API (the bench's
``BenchUpstream``, answering tagged turns with ``soak_workload.answer_message``) and Bedrock
Runtime (tests' ``FakeBedrock``: SigV4 checked, event-stream frames) for the tenant whose
upstream is Bedrock. Neither keeps request bodies.

    python bench/soak_upstream.py     # prints "UPSTREAM <anthropic url> <bedrock url>"
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import deque
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from bench.servers import BenchUpstream, raise_nofile, serve_upstream  # noqa: E402
from bench.soak_workload import (  # noqa: E402
    RETRIEVE_ID,
    answer_message,
    hidden_round,
    retrieval_call,
    tag_of,
)
from tests.platform_fakes import FakeBedrock  # noqa: E402
from tests.upstream import Reply, Stream, message_json, message_stream_events  # noqa: E402

RETRIEVE_SHARE = 0.1


def answer_for(raw: bytes, body: Any, model: str) -> dict[str, Any]:
    """The message answering a Messages request of the soak: a tagged turn's answer, the
    upstream's call of the retrieval tool, the answer after the proxy's hidden round, or a plain
    text (the proxy's summary calls carry no tag)."""
    thinking = isinstance(body, dict) and isinstance(body.get("thinking"), dict)
    tokens = len(raw) // 4
    if hidden_round(body):
        last = body["messages"][-1]["content"]
        ident = next(str(b["tool_use_id"]) for b in last if isinstance(b, dict) and "tool_use_id" in b)
        return answer_message(ident[len(RETRIEVE_ID):], thinking, model, tokens)
    tag = tag_of(body)
    if tag is None:
        return message_json("Summary: the session read handlers and fixed a parser.", model=model,
                            input_tokens=tokens)
    call = retrieval_call(tag, raw, body, RETRIEVE_SHARE)
    if call is not None:
        message = answer_message(tag, False, model, tokens)
        message["content"] = [call]
        return message
    return answer_message(tag, thinking, model, tokens)


class SoakUpstream(BenchUpstream):
    def _default(self, recorded: Any) -> Any:
        if recorded.path.endswith("/messages/count_tokens"):
            return Reply({"input_tokens": len(recorded.body) // 4})
        if recorded.path.endswith("/messages") and not recorded.headers.get("x-bench-mode"):
            body = orjson.loads(recorded.body)
            model = str(body.get("model", "claude-fake-1"))
            message = answer_for(recorded.body, body, model)
            if body.get("stream"):
                return Stream(events=message_stream_events(message))
            return Reply(message)
        return super()._default(recorded)


def _bedrock_answer(path: str, body: dict[str, Any]) -> dict[str, Any]:
    return answer_for(orjson.dumps(body), body, "claude-sonnet-4-5-20250929")


async def _run() -> None:
    raise_nofile()
    # the proxy closes an upstream stream whose client left: aiohttp would log each one
    logging.getLogger("aiohttp.server").disabled = True
    bedrock = FakeBedrock(seen=deque(maxlen=8), responder=_bedrock_answer)  # type: ignore[arg-type]
    await serve_upstream(SoakUpstream(), bedrock)


if __name__ == "__main__":
    asyncio.run(_run())
