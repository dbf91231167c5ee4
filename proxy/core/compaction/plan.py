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
moves them into a shared store). Next to each plan, ``PlanCache`` keeps (in memory only, never in
the JSON) a ``PlanView``: the facts about the plan's view that the next request would otherwise
recompute from the whole history -- the token counts of the items it edits or inserts, where its
frozen part ends, its compaction id. A reused request then only materialises the plan's items by
reference and counts the messages added after the prefix.

Each message is dumped once per request (``tokens.canonical_all``, sorted keys): those bytes are
what the token counter's message memo and ``prefix_hashes`` hash. Markers are stripped (a second
dump) only for the few messages whose canonical JSON contains ``"cache_control"``; for the others
the message's own hash and its message-memo key are the same number.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

from proxy.core.bounded import Bounded
from proxy.core.compaction.bridge import Bridge
from proxy.core.compaction.manifest import ManifestRecord, record_from_json
from proxy.core.compaction.view import (
    Cut,
    FromClient,
    Inserted,
    Keep,
    Message,
    ViewItem,
)
from proxy.core.tokens import MARKER_JSON, containing, strip_markers

__all__ = [
    "LAYERS",
    "Plan",
    "PlanCache",
    "PlanView",
    "message_hash",
    "prefix_hashes",
    "rolling_hashes",
]

LAYERS = ("truncate", "dedup", "prune", "summarize")
_VERSION = 1
_PAIR = struct.Struct(">QQ")  # h_{k-1} and the message's own hash, 8 bytes each, big-endian


def message_hash(message: Message, canonical: bytes | None = None) -> int:
    """xxh3_64 of the message's canonical JSON, ``cache_control`` markers left out.

    ``canonical``: the message's ``canonical_json`` when the caller has it (saves the dump). The
    markers are stripped (and the message dumped again) only when its JSON shows one."""
    if canonical is None:
        try:
            canonical = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # maybe a marker that is not JSON: stripping it may help
            canonical = None
    if canonical is None or MARKER_JSON in canonical:
        canonical = orjson.dumps(strip_markers(message), option=orjson.OPT_SORT_KEYS)
    return xxhash.xxh3_64_intdigest(canonical)


def prefix_hashes(
    messages: Sequence[Message],
    canonical: Sequence[bytes | None] | None = None,
    marked: Sequence[bool] | None = None,
) -> tuple[str, ...]:
    """Hex rolling hashes: element ``k`` identifies ``messages[0:k]`` (so there are n + 1).

    ``canonical``: each message's ``canonical_json``, when the caller has them (one dump per
    message then serves both this and the token count); ``marked``: per message, whether its
    canonical JSON contains ``"cache_control"`` (``containing``), when the caller has that too."""
    if canonical is None:
        canonical = [None] * len(messages)
    elif len(canonical) != len(messages):
        raise ValueError("canonical must hold one entry per message")
    if marked is None:
        marked = containing(canonical, MARKER_JSON)
    digest = xxhash.xxh3_64_intdigest
    own = [
        message_hash(message, raw) if may_have or raw is None else digest(raw)
        for message, raw, may_have in zip(messages, canonical, marked, strict=True)
    ]
    return ("0" * 16, *rolling_hashes(own))


def rolling_hashes(own: Sequence[int], start: str = "0" * 16) -> list[str]:
    """The prefix hashes after ``start`` (the hash of the messages before these): element ``k``
    extends it by ``own[0..k]``, the messages' own hashes (``message_hash``)."""
    digest = xxhash.xxh3_64_intdigest
    pack = _PAIR.pack
    h = int(start, 16)
    out: list[str] = []
    append = out.append
    for mh in own:
        h = digest(pack(h, mh))
        append(f"{h:016x}")
    return out


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
    # Whether its view, or the view of a plan it was built on, names a pointer the model can
    # redeem (``proxy.core.compaction.retrieval.plan_names_pointers``): from then on the
    # conversation's views offer the retrieval tool. ``None``: stored before this was recorded.
    pointers: bool | None = None

    def to_data(self) -> dict[str, Any]:
        data = {
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
        if self.pointers is not None:
            data["pointers"] = self.pointers
        return data

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
            pointers = raw.get("pointers")
            if pointers is not None and not isinstance(pointers, bool):
                raise ValueError("pointers must be true, false or absent")
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
                pointers=pointers,
            )
        except (KeyError, TypeError, AttributeError, orjson.JSONDecodeError) as exc:
            raise ValueError(f"malformed plan: {exc}") from exc

    @property
    def compaction_id(self) -> str:
        """Deterministic id: a hash of the tenant, the prefix hash and the view items."""
        items = orjson.dumps([_item_json(i) for i in self.items], option=orjson.OPT_SORT_KEYS)
        payload = b"\0".join([self.tenant.encode(), self.prefix_hash.encode(), items])
        return xxhash.xxh3_128_hexdigest(payload)


@dataclass(frozen=True, slots=True)
class PlanView:
    """What a plan's view is, as far as it holds for *every* request with the plan's prefix.

    Derived from the plan (and the prefix it matches), kept next to it in ``PlanCache`` only:
    never serialised. The client's messages are not kept -- a view always takes them (and their
    ``cache_control`` markers, and their key order) from the current request -- only what would
    otherwise cost a walk over the whole history:

    * ``tokens[i]``: raw tokens of item ``i`` when they do not depend on the request, i.e. for an
      ``Inserted`` item, and for an edited ``FromClient`` item whose source message had no marker
      when it was counted (a request whose source message has none gets the same message);
      ``None``: count it on each request (a whole client message is counted anyway);
    * ``frozen``: ``compaction_end`` of the items' messages (markers never change it);
    * ``client_frozen``: ``compaction_end`` of the client prefix ``messages[0:prefix_len]``;
    * ``compaction_id``: ``plan.compaction_id``.
    """

    tokens: tuple[int | None, ...]
    frozen: int
    client_frozen: int
    compaction_id: str


class _Slot:
    """A plan in the cache, the bytes of its JSON (its weight) and, once a request has built it,
    its view."""

    __slots__ = ("plan", "view", "weight")

    def __init__(self, plan: Plan, view: PlanView | None, weight: int) -> None:
        self.plan = plan
        self.view = view
        self.weight = weight


# The memory a cached plan takes (measured: tests/test_bounded_caches.py): ~3.3x the bytes of its
# JSON (items and manifest records are objects; the JSON spells them in a few bytes), plus the
# conversation's slot in the LRU.
PLAN_MEMORY_PER_JSON_BYTE = 3.8
PLAN_SLOT_BYTES = 400


class PlanCache:
    """Bounded LRU of plans (and their ``PlanView``), grouped by ``(tenant, anchor)``
    (``compaction_plans`` in the metrics).

    Safe for one event loop (no awaits inside) and for threads (one lock). A conversation keeps at
    most ``per_conversation`` plans (the longest prefixes; an agent only ever extends its latest
    one, but a client may retry from an earlier turn); ``max_plans`` bounds them all and
    ``max_bytes`` the bytes of their JSON (though the conversation whose plan was put last keeps
    its plans whatever their size). Beyond ``max_plans`` the least recently used conversation
    loses its shortest plan; beyond ``max_bytes`` it loses them all. A miss costs
    a store read (``plan_reads``: the conversation's plans come back from the store before its
    next turn), or, without a stored plan, compacting anew.
    """

    name = "compaction_plans"

    def __init__(
        self, max_plans: int = 10_000, per_conversation: int = 4, max_bytes: int | None = None
    ) -> None:
        if max_plans < 1 or per_conversation < 1:
            raise ValueError("max_plans and per_conversation must be >= 1")
        self._per = per_conversation
        self._groups: Bounded[tuple[str, str], list[_Slot]] = Bounded(
            self.name,
            max_plans,
            entry_bytes=PLAN_SLOT_BYTES,
            max_weight=max_bytes,
            weight_factor=PLAN_MEMORY_PER_JSON_BYTE,
            on_evict=self._evicted,
            # the conversation being served keeps its plans, whatever their size: compaction
            # reads them from here after the store read-through (else: compacted anew each turn)
            spare_newest=True,
            idle_forget=True,
        )
        self._size = 0
        self.evictions = 0
        self.expired = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._size

    # --- what the metrics read (``proxy.core.bounded.CacheView``) ---

    @property
    def max_entries(self) -> int:
        return self._groups.max_entries

    @property
    def max_weight(self) -> int | None:
        return self._groups.max_weight

    @property
    def weight(self) -> int:
        return self._groups.weight

    @property
    def bound_bytes(self) -> int:
        groups = self._groups
        if groups.max_weight is None:  # bounded in number only: at the size of a typical plan
            return groups.max_entries * (PLAN_SLOT_BYTES + int(8192 * PLAN_MEMORY_PER_JSON_BYTE))
        return groups.bound_bytes

    def _evicted(self, _key: tuple[str, str], group: list[_Slot]) -> None:
        self._size -= len(group)
        self.evictions += len(group)

    def forget_idle(self, now: float, idle: float) -> int:
        """Forget the plans of conversations with no turn for ``idle`` seconds (read back from
        the store if they come back); the count of plans forgotten."""
        with self._lock:
            size = self._size
            self._groups.forget_idle(now, idle)
            gone = size - self._size
            self.evictions -= gone  # ``_evicted`` counted them: they expired, no bound pushed them
            self.expired += gone
            return gone

    # --- lookups ---

    def lookup(self, tenant: str, anchor: str, hashes: Sequence[str], limit: int) -> Plan | None:
        """The longest plan of the conversation whose prefix matches ``hashes`` (see
        ``prefix_hashes``) and covers at most ``limit`` messages."""
        found = self.match(tenant, anchor, hashes, limit)
        return None if found is None else found[0]

    def match(
        self, tenant: str, anchor: str, hashes: Sequence[str], limit: int
    ) -> tuple[Plan, PlanView | None] | None:
        """``lookup``, with the plan's view when one has been attached."""
        with self._lock:
            group = self._groups.get((tenant, anchor))
            if not group:
                return None
            for slot in group:  # longest first
                plan = slot.plan
                k = plan.prefix_len
                if k <= limit and k < len(hashes) and hashes[k] == plan.prefix_hash:
                    return plan, slot.view
            return None

    def put(self, plan: Plan, view: PlanView | None = None, weight: int | None = None) -> None:
        """Keep ``plan`` (``weight``: the bytes of its JSON, when the caller has them)."""
        if weight is None:
            weight = len(plan.to_json())
        key = (plan.tenant, plan.anchor)
        with self._lock:
            groups = self._groups
            group = groups.pop(key) or []
            self._size -= len(group)
            group = [s for s in group if s.plan.prefix_len != plan.prefix_len]
            group.append(_Slot(plan, view, weight))
            group.sort(key=lambda s: s.plan.prefix_len, reverse=True)
            del group[self._per :]
            self._size += len(group)
            groups.put(key, group, sum(s.weight for s in group))
            while self._size > groups.max_entries:
                oldest = groups.oldest()
                assert oldest is not None
                oldest_key, slots = oldest
                shorter = slots[:-1]  # its shortest prefix goes
                self._size -= 1
                self.evictions += 1
                if shorter:
                    groups.update(oldest_key, shorter, sum(s.weight for s in shorter))
                else:
                    groups.pop(oldest_key)

    def attach(self, plan: Plan, view: PlanView) -> None:
        """Keep ``view`` with ``plan`` if that very plan is still cached (else: nothing)."""
        with self._lock:
            for slot in self._groups.peek((plan.tenant, plan.anchor)) or ():
                if slot.plan is plan:
                    slot.view = view
                    return

    def discard(self, plan: Plan) -> None:
        """Forget ``plan`` (that very value), e.g. one superseded by another replica's."""
        key = (plan.tenant, plan.anchor)
        with self._lock:
            group = self._groups.peek(key)
            if not group:
                return
            kept = [s for s in group if s.plan is not plan]
            self._size -= len(group) - len(kept)
            if kept:
                self._groups.update(key, kept, sum(s.weight for s in kept))
            else:
                self._groups.pop(key)

    def plans(self, tenant: str, anchor: str) -> tuple[Plan, ...]:
        with self._lock:
            return tuple(s.plan for s in self._groups.peek((tenant, anchor)) or ())
