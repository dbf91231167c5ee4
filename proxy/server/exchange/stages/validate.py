"""The body parsed (a re-sent history through the body memo), its nesting and tool protocol
checked: a broken request is a 400 before anything is forwarded or recorded."""

from __future__ import annotations

import hashlib

import orjson
from aiohttp import web

from proxy.core.conversation import Conversation
from proxy.core.errors import InvalidRequest
from proxy.core.nesting import MAX_DEPTH, check_nesting
from proxy.core.protocol import scan_messages
from proxy.core.reparse import BodyMemo, Parsed
from proxy.server.compaction.service import compaction_runs
from proxy.server.exchange.exchange import Exchange
from proxy.server.exchange.stage import Stage
from proxy.server.http import spans

# The latest parsed body of each conversation: a re-sent history is not parsed (nor validated,
# nor hashed) again. See proxy.core.reparse.
BODIES = web.AppKey("bodies", BodyMemo)
# The validator's state is kept after each of the last messages of a request: the next turn
# re-sends the history up to about there (its client moves the cache breakpoint).
CHECKPOINTS_KEPT = 8


def memo_scope(request: web.Request, tenant: str, conversation: Conversation | None) -> str:
    """Whose remembered bodies a request may continue: its tenant's, and among those only the
    ones sent with the same credential (without tenant policies every client is the default
    tenant: one client's bodies, or how fast they parse, tell nothing to another), in the same
    conversation (a session's agents often open with the same words: each keeps its own body)."""
    credential = request.headers.get("x-api-key") or request.headers.get("authorization") or ""
    digest = hashlib.blake2b(credential.encode(), digest_size=8).hexdigest()
    where = conversation.scope if conversation is not None else ""
    return f"{tenant}\0{digest}\0{where}"


def parse_messages_body(text: bytes, memo: BodyMemo | None = None, scope: str = "") -> Parsed:
    """The parsed body (through ``memo``: a re-sent history is not parsed again), checked."""
    try:
        parsed = memo.parse(scope, text) if memo is not None else Parsed(orjson.loads(text), text, scope)
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith("depth limit exceeded"):
            raise InvalidRequest(
                f"request body is not valid JSON: nested deeper than {MAX_DEPTH} levels (the"
                f" proxy's limit for a request body; {exc})"
            ) from None
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    body = parsed.body
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    if "messages" not in body:
        raise InvalidRequest("messages: Field required")
    if not isinstance(body["messages"], list):
        raise InvalidRequest("messages: Input should be a valid list")
    return parsed


class Validate(Stage):
    """``ex.parsed``, ``ex.body`` (the client's parsed body), ``ex.checkpoints`` (the validator's
    states after the last messages, for the next turn) and ``ex.canonical`` (the new messages'
    canonical JSON, made by the nesting check when compaction will run)."""

    name = "validate"

    def __init__(self, memo: BodyMemo) -> None:
        self.memo = memo

    async def request(self, ex: Exchange) -> None:
        tenant = ex.tenant
        with spans.span("context_proxy.validate"):
            parsed = parse_messages_body(
                ex.text, self.memo, memo_scope(ex.request, tenant.name, ex.conversation)
            )
            body = parsed.body
            n = len(body["messages"])
            keep = range(max(0, n - CHECKPOINTS_KEPT), n + 1) if parsed.rememberable else ()
            # the new messages' canonical JSON, made in the same step, serves compaction
            too_deep, canonical = check_nesting(
                body,
                parsed.reused,
                parsed.reused_members,
                make_canonical=compaction_runs(ex.request.headers, tenant.compaction),
            )
            if too_deep is not None:
                raise InvalidRequest(too_deep)
            violation, checkpoints = scan_messages(body["messages"], parsed.checkpoint, keep)
            if violation is not None:
                raise InvalidRequest(violation.message)
        ex.parsed = parsed
        ex.body = body
        ex.faithful = ex.raw
        ex.checkpoints = checkpoints
        ex.canonical = canonical
