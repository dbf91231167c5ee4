"""``python -m proxy`` under ``tracemalloc``, for bench/bench_soak.py ``--find``.

    python bench/soak_probe.py OUT_DIR INTERVAL_S FRAMES serve --port 0 --config ...

A daemon thread writes, every ``INTERVAL_S`` seconds (0: only when ``OUT_DIR/take-<k>`` appears),
``OUT_DIR/snap-<k>.pickle`` (a
``tracemalloc`` snapshot, ``FRAMES`` frames deep; 0: no tracemalloc) and ``OUT_DIR/types-<k>.json``
(live objects the collector tracks, counted per type, and every container an object of the
proxy's holds, named ``Class.attribute``, with its size). bench_soak diffs them over time: what
grows with the number of sessions shows up as a named structure that keeps growing, a line of
source whose allocations do, and a type whose count does.

With ``INTERVAL_S`` > 0 the periodic samples are cheap and do not pause anything: only the native
counters, appended as one JSON line to ``OUT_DIR/native.jsonl`` (bench_soak ``--native``): glibc's
``mallinfo2()`` over all arenas (``uordblks``: bytes malloc has handed out and not had back, Python's
objects included under ``PYTHONMALLOC=malloc``; ``fordblks``: free bytes malloc holds in its heaps;
``hblkhd``: bytes in mmapped chunks), SQLite's own ``sqlite3_memory_used()`` (page caches,
statements, schema: every connection of the process), and tracemalloc's traced total when it runs.
What the heap gains is then either in use (``uordblks``; split into SQLite's and the rest) or free
but kept (``fordblks``: fragmentation).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
import threading
import time
import traceback
import tracemalloc
from collections import Counter
from collections.abc import Callable
from pathlib import Path

_CONTAINERS = (dict, list, set, frozenset, tuple, bytearray)


def _size(value: object) -> int | None:
    """How many items ``value`` holds, if it is a container (an OrderedDict, a deque... too)."""
    if isinstance(value, _CONTAINERS) or type(value).__name__ in ("deque", "OrderedDict", "defaultdict"):
        return len(value)  # type: ignore[arg-type]
    if hasattr(value, "__len__") and type(value).__module__.startswith("proxy."):
        try:
            return len(value)  # type: ignore[arg-type]
        except TypeError:
            return None
    return None


def _attributes(obj: object) -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = []
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        found.extend(d.items())
    for klass in type(obj).__mro__:
        for name in getattr(klass, "__slots__", ()):
            if isinstance(name, str) and hasattr(obj, name):
                found.append((name, getattr(obj, name)))
    return found


def _named(least: int = 50) -> dict[str, int]:
    """Every container held by an attribute of one of the proxy's objects (``Class.attr``), by a
    module global (``module.name``) or an ``lru_cache`` of a proxy function, with its size: the
    structures themselves, named. Summed per name (many instances of one class: their total)."""
    out: Counter[str] = Counter()
    for obj in gc.get_objects():
        kind = type(obj)
        module = getattr(kind, "__module__", None)
        if not isinstance(module, str) or not module.startswith(("proxy.", "aiohttp.")):
            continue
        if isinstance(obj, type):
            continue
        for name, value in _attributes(obj):
            n = _size(value)
            if n:
                out[f"{kind.__module__}.{kind.__qualname__}.{name}"] += n
    for mod_name, module in list(sys.modules.items()):
        if not mod_name.startswith("proxy.") or module is None:
            continue
        for name, value in list(vars(module).items()):
            n = _size(value)
            if n and not name.startswith("__"):
                out[f"{mod_name}.{name}"] += n
            info = getattr(value, "cache_info", None)
            if callable(info):
                out[f"{mod_name}.{name}() lru_cache"] += info().currsize
    return {k: v for k, v in out.items() if v >= least}


def _types() -> dict[str, object]:
    counts: Counter[str] = Counter()
    for obj in gc.get_objects():
        kind = type(obj)
        counts[f"{getattr(kind, '__module__', '?')}.{kind.__qualname__}"] += 1
    return {"counts": dict(counts.most_common(300)), "named": _named()}


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def _native_counters() -> Callable[[], dict[str, int]]:
    """A function reading the native counters (what this platform has of them)."""
    readers: dict[str, Callable[[], int]] = {}
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        readers.update({f"malloc_{n}": (lambda n=n: getattr(libc.mallinfo2(), n))
                        for n in ("arena", "hblkhd", "uordblks", "fordblks", "keepcost")})
    except (OSError, AttributeError):  # not glibc, or older than 2.33
        pass
    try:  # jemalloc preloaded (bench --allocator jemalloc): its own counters, glibc's say nothing
        mallctl = ctypes.CDLL(None).mallctl
        mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                            ctypes.c_void_p, ctypes.c_size_t]

        def jemalloc(stat: bytes) -> int:
            epoch, value, size = ctypes.c_uint64(1), ctypes.c_size_t(0), ctypes.c_size_t(8)
            mallctl(b"epoch", None, None, ctypes.byref(epoch), 8)  # refresh the statistics
            mallctl(stat, ctypes.byref(value), ctypes.byref(size), None, 0)
            return value.value

        readers.update({f"jemalloc_{n}": (lambda n=n: jemalloc(f"stats.{n}".encode()))
                        for n in ("allocated", "active", "resident", "retained")})
        for name in [n for n in readers if n.startswith("malloc_")]:
            del readers[name]
    except AttributeError:
        pass
    try:
        import sqlite3  # the module loads the same libsqlite3 the store uses

        del sqlite3
        lib = ctypes.CDLL("libsqlite3.so.0")
        lib.sqlite3_memory_used.restype = ctypes.c_int64
        readers["sqlite_memory_used"] = lib.sqlite3_memory_used
    except OSError:  # SQLite linked statically into the module: its counters are not reachable
        pass
    if tracemalloc.is_tracing():
        readers["tracemalloc_traced"] = lambda: tracemalloc.get_traced_memory()[0]
        readers["tracemalloc_self"] = tracemalloc.get_tracemalloc_memory
    readers["threads"] = threading.active_count
    readers["gc_full_collections"] = lambda: gc.get_stats()[2]["collections"]
    readers["gc_full_collected"] = lambda: gc.get_stats()[2]["collected"]

    def read() -> dict[str, int]:
        sample: dict[str, int] = {"t": int(time.time())}
        for name, reader in readers.items():
            sample[name] = int(reader())
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(("RssAnon:", "RssFile:")):
                    sample[line.split(":")[0]] = int(line.split()[1]) * 1024
        return sample

    return read


def _probe(out: Path, interval: float, collect: bool) -> None:
    """Every ``interval`` seconds the native counters (nothing paused); when bench_soak asks
    (``OUT_DIR/take-<k>``, written once the load is paused and nothing is in flight) the full
    measurement: then only what the process keeps is measured."""
    k = 0
    last = time.monotonic()
    native = _native_counters()
    while True:
        time.sleep(0.2)
        if interval > 0 and time.monotonic() - last >= interval:
            last = time.monotonic()
            sample = native()
            if collect:  # bench_soak --native-collect: is what the heap keeps garbage in cycles?
                started = time.perf_counter()
                sample["collected_now"] = gc.collect()
                sample["collect_ms"] = round((time.perf_counter() - started) * 1000, 1)
                sample["gc_tracked"] = len(gc.get_objects())
                sample["after_collect"] = native()
            with (out / "native.jsonl").open("a") as log:
                log.write(json.dumps(sample) + "\n")
        if not (out / f"take-{k + 1}").exists():
            continue
        k += 1
        try:
            _measure(out, k)
        except Exception:  # reported in the proxy's log; the next snapshot is tried all the same
            traceback.print_exc()
        (out / f"done-{k}").write_text("")  # bench_soak waits for it, whatever happened


def _measure(out: Path, k: int) -> None:
    # the proxy froze its start-up objects (its services, their caches): gc.get_objects()
    # sees them only unfrozen; what grows must be reachable, so garbage is collected first
    gc.unfreeze()
    gc.collect()
    if tracemalloc.is_tracing():
        snap = tracemalloc.take_snapshot().filter_traces((
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
        ))
        snap.dump(str(out / f"snap-{k}.pickle"))
    (out / f"types-{k}.json").write_text(json.dumps({"t": time.time(), **_types()}))
    gc.freeze()


def main() -> None:
    out, interval, frames = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    if frames:
        tracemalloc.start(frames)
    collect = os.environ.get("SOAK_PROBE_COLLECT") == "1"
    threading.Thread(target=_probe, args=(out, interval, collect), daemon=True).start()
    from proxy.cli.main import main as proxy_main

    sys.exit(proxy_main(sys.argv[4:]))


if __name__ == "__main__":
    main()
