"""One bounded cache type for everything the proxy keeps per session, conversation, tenant or key.

Every structure whose size would otherwise follow the number of distinct sessions, conversations,
tenants or keys that ever passed through the process is a :class:`Bounded`: a least-recently-used
map bounded in entries and, optionally, in *weight* (the bytes of text its entries hold, as the
owner measures them). When a bound is passed, the least recently used entries go first, and the
cache counts them (``evictions``). So a replica that is never restarted holds at most the sum of
its caches' bounds, whatever traffic it has seen (docs/operations/memory.md lists them all).

Correctness never depends on a hit: each owner documents what a miss costs (a re-parse, a
re-count, a store read, a ``drop_block`` request instead of a local decision...), never a different
answer.

Each cache has a ``name`` (its ``cache`` label in the metrics: ``context_proxy_cache_entries``,
``_evictions_total``, ``_bound_bytes``...) and states what it costs when full, ``bound_bytes``:
its entry bound times ``entry_bytes`` (the measured memory one entry takes, bookkeeping included;
``tests/test_bounded_caches.py`` holds each owner to its figure), plus, for a weighed cache, its
weight bound times ``weight_factor`` (the memory per byte of weight: a parsed body takes several
times its text).

An entry kept per conversation or session may also be *forgotten when idle*
(``idle_forget=True``; ``limits.cache_idle_seconds``): :meth:`Bounded.forget_idle` drops the
entries nobody used for that long, so the memory follows the conversations still going rather
than every one the process has seen (``expired`` counts them, apart from the evictions).

Pure: no clock (the sweep passes ``now``; an entry is stamped with the ``now`` of the last sweep,
so idleness is measured to within the sweeps' interval, and an owner that expires entries by
their own age keeps the time in the value), no lock (an owner shared by threads holds its own
lock around every call).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Bounded", "CacheView", "FunctionMemo"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class CacheView(Protocol):
    """What the metrics read of a cache: a :class:`Bounded`, or an owner that keeps its entries
    in one and counts them its own way (the plan cache counts plans, kept per conversation)."""

    @property
    def name(self) -> str: ...
    def __len__(self) -> int: ...
    @property
    def max_entries(self) -> int: ...
    @property
    def max_weight(self) -> int | None: ...
    @property
    def weight(self) -> int: ...
    @property
    def bound_bytes(self) -> int: ...
    @property
    def evictions(self) -> int: ...
    @property
    def expired(self) -> int: ...


class Bounded(Generic[K, V]):
    """An LRU map of at most ``max_entries`` entries (0: it keeps nothing) and, with
    ``max_weight``, at most that much total weight (``put(key, value, weight)``). Values are
    never ``None`` (``get`` answers ``None`` for a missing key).

    ``on_evict(key, value)`` is called for each entry the bounds push out (not for ``pop``,
    ``clear`` or a replaced value): an owner that indexes its entries elsewhere drops them there.
    ``spare_newest``: the weight bound never pushes out the entry put last (the one in use now),
    though it alone may pass the bound; the entry bound still applies (unless it is 0: then the
    newest is all it keeps).

    ``idle_forget``: each ``put`` and each ``get`` that finds its key stamps the entry with
    ``clock`` (the ``now`` of the last :meth:`forget_idle`), and :meth:`forget_idle` drops the
    entries stamped too long ago (``on_evict`` is called for them too).
    """

    __slots__ = (
        "_data",
        "_on_evict",
        "_spare_newest",
        "_stamps",
        "_weight",
        "_weights",
        "clock",
        "entry_bytes",
        "evictions",
        "expired",
        "max_entries",
        "max_weight",
        "name",
        "weight_factor",
    )

    def __init__(
        self,
        name: str,
        max_entries: int,
        *,
        entry_bytes: int,
        max_weight: int | None = None,
        weight_factor: float = 1.0,
        on_evict: Callable[[K, V], object] | None = None,
        spare_newest: bool = False,
        idle_forget: bool = False,
    ) -> None:
        if max_entries < 0 or (max_weight is not None and max_weight < 0):
            raise ValueError(f"{name}: bounds must be >= 0")
        self.name = name
        self.max_entries = max_entries
        self.max_weight = max_weight
        self.entry_bytes = entry_bytes
        self.weight_factor = weight_factor
        self.evictions = 0
        self.expired = 0
        self.clock = 0.0
        self._stamps: dict[K, float] | None = {} if idle_forget else None
        self._data: OrderedDict[K, V] = OrderedDict()
        self._weights: dict[K, int] | None = {} if max_weight is not None else None
        self._weight = 0
        self._on_evict = on_evict
        self._spare_newest = spare_newest

    # --- reading -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[K]:
        """The keys, least recently used first (a snapshot: the cache may change meanwhile)."""
        return iter(list(self._data))

    def get(self, key: K) -> V | None:
        """The value, made the most recently used; ``None`` when absent."""
        found = self._data.get(key)
        if found is not None:
            self._data.move_to_end(key)
            if self._stamps is not None:
                self._stamps[key] = self.clock
        return found

    def peek(self, key: K) -> V | None:
        """The value, its place in the order left as it is."""
        return self._data.get(key)

    def get_many(self, keys: Sequence[K]) -> list[V | None]:
        """``get`` of each key, in one pass (the hot loops of a large history)."""
        data = self._data
        found = list(map(data.get, keys))
        touch = data.move_to_end
        stamps, clock = self._stamps, self.clock
        for key, value in zip(keys, found, strict=True):
            if value is not None:
                touch(key)
                if stamps is not None:
                    stamps[key] = clock
        return found

    def peek_many(self, keys: Iterable[K]) -> list[V | None]:
        return list(map(self._data.get, keys))

    def oldest(self) -> tuple[K, V] | None:
        """The least recently used entry (left in place)."""
        return next(iter(self._data.items()), None)

    def items(self) -> list[tuple[K, V]]:
        """The entries, least recently used first (a copy)."""
        return list(self._data.items())

    def values(self) -> list[V]:
        return list(self._data.values())

    @property
    def weight(self) -> int:
        """The total weight of the entries (0 for a cache bounded in entries only)."""
        return self._weight

    @property
    def bound_bytes(self) -> int:
        """The memory the cache takes at its bound: the documented estimate."""
        held = self.max_entries * self.entry_bytes
        if self.max_weight is not None:
            held += int(self.max_weight * self.weight_factor)
        return held

    # --- writing -----------------------------------------------------------------------------

    def put(self, key: K, value: V, weight: int = 0) -> None:
        """Keep ``value`` under ``key`` as the most recently used, then evict what the bounds
        push out (the entry itself too, when it alone is over the weight bound, unless
        ``spare_newest``)."""
        if self.max_entries == 0 and not self._spare_newest:
            return
        data = self._data
        weights = self._weights
        if weights is not None:
            self._weight += weight - weights.get(key, 0)
            weights[key] = weight
        data[key] = value
        data.move_to_end(key)
        if self._stamps is not None:
            self._stamps[key] = self.clock
        if len(data) > self.max_entries or (
            weights is not None and self.max_weight is not None and self._weight > self.max_weight
        ):
            self._evict()

    def update(self, key: K, value: V, weight: int = 0) -> None:
        """Replace the value (and weight) of a present ``key`` where it stands in the order (an
        owner shrinking an entry); nothing when absent. Evicts nothing: a lighter entry never
        passes a bound."""
        data = self._data
        if key not in data:
            return
        data[key] = value  # an existing key keeps its place
        if self._weights is not None:
            self._weight += weight - self._weights.get(key, 0)
            self._weights[key] = weight

    def resize(self, max_entries: int) -> None:
        """A new entry bound (an owner made before its configuration was read); the least
        recently used go at once beyond it."""
        if max_entries < 0:
            raise ValueError(f"{self.name}: bounds must be >= 0")
        self.max_entries = max_entries
        self._evict()

    def touch(self, key: K) -> None:
        """Make ``key`` the most recently used, if present."""
        if key in self._data:
            self._data.move_to_end(key)
            if self._stamps is not None:
                self._stamps[key] = self.clock

    def pop(self, key: K) -> V | None:
        """Remove ``key`` (not an eviction); its value, or ``None``."""
        value = self._data.pop(key, None)
        if value is not None:
            self._forget_key(key)
        return value

    def clear(self) -> None:
        self._data.clear()
        if self._weights is not None:
            self._weights.clear()
        if self._stamps is not None:
            self._stamps.clear()
        self._weight = 0

    def forget_idle(self, now: float, idle: float) -> int:
        """Drop the entries not used since ``now - idle`` (as far as the stamps tell: an entry
        used since the last call carries that call's ``now``); the count dropped. Then ``now``
        stamps what is used until the next call. The first call only sets the clock (what was
        kept before it has no time yet). Nothing without ``idle_forget``."""
        stamps = self._stamps
        if stamps is None:
            return 0
        first, self.clock = self.clock == 0.0, now
        if first:
            for key in stamps:
                stamps[key] = now
            return 0
        data, cutoff, dropped = self._data, now - idle, 0
        # the order is the order of use, so the stamps never decrease along it: the walk stops at
        # the first entry used recently enough
        while data:
            key = next(iter(data))
            if stamps.get(key, now) >= cutoff:
                break
            value = data.pop(key)
            self._forget_key(key)
            dropped += 1
            if self._on_evict is not None:
                self._on_evict(key, value)
        self.expired += dropped
        return dropped

    def _forget_key(self, key: K) -> None:
        if self._weights is not None:
            self._weight -= self._weights.pop(key, 0)
        if self._stamps is not None:
            self._stamps.pop(key, None)

    def _evict(self) -> None:
        data, weights = self._data, self._weights
        floor = 1 if self._spare_newest else 0
        while len(data) > floor and (
            len(data) > self.max_entries
            or (weights is not None and self.max_weight is not None and self._weight > self.max_weight)
        ):
            key, value = data.popitem(last=False)
            self._forget_key(key)
            self.evictions += 1
            if self._on_evict is not None:
                self._on_evict(key, value)


class FunctionMemo:
    """A pure function's ``functools.lru_cache`` seen as a cache for the metrics (thread-safe in
    C, which the parsers called from worker threads need). Its evictions are its misses less its
    entries: every miss adds an entry and only the bound takes one out (it is never cleared)."""

    max_weight = None
    weight = 0
    expired = 0  # content-keyed: nothing of one conversation to forget when it goes idle

    def __init__(self, name: str, function: Any, entry_bytes: int) -> None:
        self.name = name
        self.function = function
        self.entry_bytes = entry_bytes

    def __len__(self) -> int:
        return int(self.function.cache_info().currsize)

    @property
    def max_entries(self) -> int:
        return int(self.function.cache_info().maxsize)

    @property
    def bound_bytes(self) -> int:
        return self.max_entries * self.entry_bytes

    @property
    def evictions(self) -> int:
        info = self.function.cache_info()
        return max(0, int(info.misses) - int(info.currsize))
