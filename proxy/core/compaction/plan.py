"""Plans: a compaction remembered, so that later turns of the same conversation reuse it.

The provider's prompt cache is an exact-prefix cache; recompacting from scratch every turn would
change the view's prefix each time. So when the pipeline compacts ``messages[0:n]`` it records a
``Plan``: the client prefix ``messages[0:n-1]`` it replaced (by length and rolling hash) and the
view items that replace it. The next request of the conversation starts with the same prefix, so
its view is ``plan view + messages[n-1:]`` -- the earlier view byte for byte, plus the new turns.

Prefix hash: ``h_0 = 0``, ``h_k = xxh3_64(h_{k-1} (8 bytes, big-endian) + xxh3_64(message_{k-1}))``
where a message's own hash is over ``orjson.dumps(message, OPT_SORT_KEYS)`` with its
``cache_control`` markers removed: clients move their breakpoint from turn to turn, and a marker is
not part of the cached prefix, so it must not make a plan miss (the view takes the markers of the
current request, see ``view``). The anchor of a conversation is ``h_1`` (a function of
``messages[0]`` alone), so ``PlanCache`` keeps the plans of a conversation together under
``(tenant, anchor)`` and a lookup compares a handful of hashes.

Plans are plain values: ``to_json()`` / ``from_json()`` round-trip them exactly (a later issue
moves them into a shared store).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from proxy.core.compaction.bridge import Bridge
from proxy.core.compaction.manifest import ManifestRecord, record_from_json
from proxy.core.compaction.view import (
    Cut,
    FromClient,
    Inserted,
    Keep,
    Message,
    ViewItem,
    strip_markers,
)

__all__ = [
    "LAYERS",
    "Plan",
    "PlanCache",
    "message_hash",
    "prefix_hashes",
]

LAYERS = ("truncate", "dedup", "prune", "summarize")
_VERSION = 1


def message_hash(message: Message) -> int:
    """xxh3_64 of the message's canonical JSON, ``cache_control`` markers left out."""
    return xxhash.xxh3_64_intdigest(
        orjson.dumps(strip_markers(message), option=orjson.OPT_SORT_KEYS)
    )


def prefix_hashes(messages: Sequence[Message]) -> tuple[str, ...]:
    """Hex rolling hashes: element ``k`` identifies ``messages[0:k]`` (so there are n + 1)."""
    out = [f"{0:016x}"]
    h = 0
    for message in messages:
        h = xxhash.xxh3_64_intdigest(
            h.to_bytes(8, "big") + message_hash(message).to_bytes(8, "big")
        )
        out.append(f"{h:016x}")
    return tuple(out)


def _item_json(item: ViewItem) -> dict[str, Any]:
    if isinstance(item, Inserted):
        return {"m": item.message}
    if item.blocks is None:
        return {"o": item.origin}
    ops: list[Any] = [
        op.index if isinstance(op, Keep) else {"i": op.index, "c": op.content} for op in item.blocks
    ]
    return {"o": item.origin, "b": ops}


def _item_from_json(data: Any) -> ViewItem:
    if not isinstance(data, Mapping):
        raise ValueError("plan item must be an object")
    if "m" in data:
        message = data["m"]
        if not isinstance(message, dict):
            raise ValueError("inserted plan item must hold a message object")
        return Inserted(message)
    origin = data["o"]
    if not isinstance(origin, int) or origin < 0:
        raise ValueError("plan item origin must be a non-negative integer")
    if "b" not in data:
        return FromClient(origin)
    ops: list[Keep | Cut] = []
    for op in data["b"]:
        if isinstance(op, int):
            ops.append(Keep(op))
        elif isinstance(op, Mapping) and isinstance(op.get("i"), int) and "c" in op:
            ops.append(Cut(op["i"], op["c"]))
        else:
            raise ValueError("malformed block op in plan item")
    return FromClient(origin, tuple(ops))


@dataclass(frozen=True, slots=True)
class Plan:
    """How the client prefix ``messages[0:prefix_len]`` (hash ``prefix_hash``) is replaced."""

    tenant: str
    anchor: str
    prefix_len: int
    prefix_hash: str
    items: tuple[ViewItem, ...]
    layers: tuple[str, ...]
    manifest: tuple[ManifestRecord, ...]
    bridge: Bridge | None
    summary_status: str  # of the compaction that made the plan: "ok" | "failed" | "skipped"

    def to_data(self) -> dict[str, Any]:
        return {
            "v": _VERSION,
            "tenant": self.tenant,
            "anchor": self.anchor,
            "prefix_len": self.prefix_len,
            "prefix_hash": self.prefix_hash,
            "items": [_item_json(i) for i in self.items],
            "layers": list(self.layers),
            "manifest": [r.to_json() for r in self.manifest],
            "bridge": None if self.bridge is None else self.bridge.to_json(),
            "summary_status": self.summary_status,
        }

    def to_json(self) -> bytes:
        """JSON that ``from_json`` turns back into an equal plan whose view has the same bytes.

        Keys keep their order (no sorting): the view's blocks must come back with the client's
        key order, or the forwarded bytes (and the provider's cached prefix) would change.
        """
        return orjson.dumps(self.to_data())

    @staticmethod
    def from_json(data: bytes | str) -> Plan:
        """Inverse of ``to_json``; raises ``ValueError`` on anything malformed."""
        try:
            raw = orjson.loads(data)
            if raw.get("v") != _VERSION:
                raise ValueError(f"unsupported plan version {raw.get('v')!r}")
            layers = tuple(str(x) for x in raw["layers"])
            if any(x not in LAYERS for x in layers):
                raise ValueError(f"unknown layer in {layers!r}")
            status = raw["summary_status"]
            if status not in ("ok", "failed", "skipped"):
                raise ValueError(f"unknown summary status {status!r}")
            bridge = raw["bridge"]
            prefix_len = raw["prefix_len"]
            if not isinstance(prefix_len, int) or prefix_len < 1:
                raise ValueError("prefix_len must be a positive integer")
            items = tuple(_item_from_json(i) for i in raw["items"])
            if any(isinstance(i, FromClient) and i.origin >= prefix_len for i in items):
                raise ValueError("plan item refers past its prefix")
            return Plan(
                tenant=str(raw["tenant"]),
                anchor=str(raw["anchor"]),
                prefix_len=prefix_len,
                prefix_hash=str(raw["prefix_hash"]),
                items=items,
                layers=layers,
                manifest=tuple(record_from_json(r) for r in raw["manifest"]),
                bridge=None if bridge is None else Bridge.from_json(bridge),
                summary_status=status,
            )
        except (KeyError, TypeError, AttributeError, orjson.JSONDecodeError) as exc:
            raise ValueError(f"malformed plan: {exc}") from exc

    @property
    def compaction_id(self) -> str:
        """Deterministic id: a hash of the tenant, the prefix hash and the view items."""
        items = orjson.dumps([_item_json(i) for i in self.items], option=orjson.OPT_SORT_KEYS)
        payload = b"\0".join([self.tenant.encode(), self.prefix_hash.encode(), items])
        return xxhash.xxh3_128_hexdigest(payload)


class PlanCache:
    """Bounded LRU of plans, grouped by ``(tenant, anchor)``.

    Safe for one event loop (no awaits inside) and for threads (one lock). A conversation keeps at
    most ``per_conversation`` plans (the longest prefixes; an agent only ever extends its latest
    one, but a client may retry from an earlier turn); ``max_plans`` bounds them all.
    """

    def __init__(self, max_plans: int = 10_000, per_conversation: int = 4) -> None:
        if max_plans < 1 or per_conversation < 1:
            raise ValueError("max_plans and per_conversation must be >= 1")
        self._max = max_plans
        self._per = per_conversation
        self._groups: OrderedDict[tuple[str, str], list[Plan]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._size

    def lookup(self, tenant: str, anchor: str, hashes: Sequence[str], limit: int) -> Plan | None:
        """The longest plan of the conversation whose prefix matches ``hashes`` (see
        ``prefix_hashes``) and covers at most ``limit`` messages."""
        with self._lock:
            group = self._groups.get((tenant, anchor))
            if not group:
                return None
            self._groups.move_to_end((tenant, anchor))
            for plan in group:  # longest first
                k = plan.prefix_len
                if k <= limit and k < len(hashes) and hashes[k] == plan.prefix_hash:
                    return plan
            return None

    def put(self, plan: Plan) -> None:
        key = (plan.tenant, plan.anchor)
        with self._lock:
            group = self._groups.pop(key, [])
            self._size -= len(group)
            group = [p for p in group if p.prefix_len != plan.prefix_len]
            group.append(plan)
            group.sort(key=lambda p: p.prefix_len, reverse=True)
            del group[self._per :]
            self._groups[key] = group
            self._size += len(group)
            while self._size > self._max:
                oldest_key, oldest = next(iter(self._groups.items()))
                oldest.pop()  # its shortest prefix
                self._size -= 1
                if not oldest:
                    del self._groups[oldest_key]

    def plans(self, tenant: str, anchor: str) -> tuple[Plan, ...]:
        with self._lock:
            return tuple(self._groups.get((tenant, anchor), ()))
