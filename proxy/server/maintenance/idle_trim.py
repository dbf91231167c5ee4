"""Give memory back to the system when the proxy goes idle after a burst or a busy period.

Measured (bench/bench_memory.py): 1,000 simultaneous streams raise the RSS by ~38 MB, and none of
it comes back by itself. What stays is not live data (once the upstream pool's idle keep-alive
connections expire, the interpreter's allocated blocks are back to their level before the burst),
but (1) garbage cycles nobody collects -- an idle process allocates nothing, so the collector never
runs -- and (2) free memory the allocators keep. So once in-flight requests drop to zero after a
busy period, the proxy runs one full collection (cheap: the program's own objects are frozen at
start-up) and ``malloc_trim(0)`` (glibc), and does it once more after the upstream pool's idle
connections had time to expire. A busy period is a burst (32 requests in flight at once) or a
steady load (requests in flight at 30 polls): a load that never peaks, going quiet, left free
memory all the same (bench/bench_soak.py: its RSS stayed where the load left it); or the idle
sweeps forgot 64 cached entries or more (``idle_caches.py``: the conversations of a load that
stopped ten minutes ago: their memory goes back too). Nothing of this
is on the request path: a 1 s poll of the in-flight counter.

What decides how much comes back is the small-object allocator. Python's own (pymalloc) returns
an arena (1 MiB) only when wholly empty, and after a 1,000-stream burst ~27 of them stay, each
held by a few blocks allocated during the burst that outlive it (free lists of C extensions such
as aiohttp's parser messages and asyncio's future iterators, metric values, timestamps): ~28 MB,
1.3x rest after 70 s, and no collection or trim can free a partly used arena. With
``PYTHONMALLOC=malloc`` small objects come from glibc, whose ``malloc_trim(0)`` gives back every
free page wherever it lies: 1.06x rest. That costs latency (glibc makes and frees small objects
more slowly): measured side by side in one run, ~0.1 ms on a 1 KB request and ~0.5-3 ms on a
320 KB body never seen before (bench/README.md, third pass). The Docker image sets it;
:func:`small_object_allocator` says which one runs, and the poll logs it once at start-up.

Under a steady load that never stops, though, glibc's heap fragments: in a 30-minute soak
(bench/bench_soak.py ``--native``) the bytes it had handed out levelled off once the caches were
full while the free bytes it kept between them went on growing (``fordblks`` 37 -> 52 MB over
the second half), and RSS with them. With jemalloc in place of glibc's malloc (preloaded:
``LD_PRELOAD=libjemalloc.so.2``, what the Docker image does) the heap levels off with the caches.
Then the release purges jemalloc's arenas (``mallctl("arena.<all>.purge")``) instead of
``malloc_trim``, which would not see its memory.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import sys
from collections.abc import Callable

from proxy.server.appkeys import ProxyState

log = logging.getLogger("context_proxy.memory")

# A busy period: at least this many requests in flight at once since the last release, or...
BUSY_INFLIGHT = 32
# ... requests in flight at this many polls since then (a steady load that never peaks: its
# requests' buffers and the caches' churn leave free memory in the allocator all the same)
BUSY_POLLS = 30
# ... or the idle sweeps forgot at least this many cached entries (maintenance/idle_caches.py:
# the conversations of a load that stopped ten minutes ago), or...
FORGOTTEN = 64
# Release when nothing was in flight for this many polls (of POLL_SECONDS) after a busy period...
QUIET_POLLS = 2
# ... and once more after this many quiet polls: the upstream pool (keep-alive 30 s, swept every
# 30 s) has closed the burst's connections by then.
LATE_POLLS = 65
POLL_SECONDS = 1.0


class TrimSchedule:
    """When to release memory, from the in-flight count seen at each poll (pure; no clock)."""

    def __init__(
        self,
        busy: int = BUSY_INFLIGHT,
        quiet: int = QUIET_POLLS,
        late: int = LATE_POLLS,
        busy_polls: int = BUSY_POLLS,
    ) -> None:
        self.busy, self.quiet, self.late, self.busy_polls = busy, quiet, late, busy_polls
        self._peak = 0  # most requests in flight at once since the last release
        self._active = 0  # polls with requests in flight since the last release
        self._quiet = 0  # consecutive polls with nothing in flight
        self._late_pending = False
        self._forgotten = 0  # entries the idle sweeps forgot since the last release

    def tick(self, inflight: int, forgotten: int = 0) -> bool:
        """One poll (``forgotten``: cached entries the idle sweeps dropped since the last poll);
        ``True``: release now."""
        self._forgotten += forgotten
        if inflight:
            self._peak = max(self._peak, inflight)
            self._active += 1
            self._quiet = 0
            return False
        self._quiet += 1
        busy = self._peak >= self.busy or self._active >= self.busy_polls or self._forgotten >= FORGOTTEN
        if busy and self._quiet >= self.quiet:
            self._peak = self._active = self._forgotten = 0
            self._late_pending = True
            return True
        if self._late_pending and self._quiet >= self.late:
            self._late_pending = False
            return True
        return False


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or ``None`` elsewhere (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _malloc_trim()

# jemalloc's "all arenas" index (MALLCTL_ARENAS_ALL)
_ALL_ARENAS = 4096


def _jemalloc_purge() -> Callable[[], int] | None:
    """A function purging every jemalloc arena (their dirty pages back to the system at once),
    when jemalloc is this process's malloc (preloaded); else ``None``."""
    try:
        mallctl = ctypes.CDLL(None).mallctl
    except (OSError, AttributeError):
        return None
    mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    mallctl.restype = ctypes.c_int
    name = f"arena.{_ALL_ARENAS}.purge".encode()
    return lambda: int(mallctl(name, None, None, None, 0))


_PURGE = _jemalloc_purge()


def small_object_allocator() -> str:
    """``"pymalloc"`` (Python's arenas), ``"malloc"`` (``PYTHONMALLOC=malloc``: glibc's heap) or
    ``"jemalloc"`` (``PYTHONMALLOC=malloc`` with jemalloc preloaded in place of glibc's malloc).

    Read from the interpreter, not the environment: without pymalloc it counts no blocks, and
    jemalloc is there when its ``mallctl`` is."""
    if sys.getallocatedblocks():
        return "pymalloc"
    return "jemalloc" if _PURGE is not None else "malloc"


def rss_bytes() -> int | None:
    """This process's resident set size (Linux), else ``None``."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def release_memory() -> bool:
    """A full collection, then jemalloc's purge or glibc's ``malloc_trim(0)``, whichever this
    process's malloc is; ``True`` if one of them ran."""
    before = rss_bytes()
    unreachable = gc.collect()
    if _PURGE is not None:
        trimmed = _PURGE() == 0
    else:
        trimmed = _TRIM is not None and _TRIM(0) >= 0
    after = rss_bytes()
    if before is not None and after is not None:
        # one line per busy period: what the collection found and what RSS came back (garbage
        # in reference cycles waits for Python's next full collection while the load lasts)
        log.info(
            "memory released after a busy period: RSS %.1f -> %.1f MB, %d unreachable objects collected",
            before / 2**20, after / 2**20, unreachable,
        )
    return trimmed


async def release_when_idle(
    state: ProxyState,
    schedule: TrimSchedule | None = None,
    release: Callable[[], object] = release_memory,
    poll_seconds: float = POLL_SECONDS,
) -> None:
    """Poll ``state.inflight`` until cancelled; ``release()`` when ``schedule`` says so."""
    schedule = schedule or TrimSchedule()
    allocator = small_object_allocator()
    if allocator == "jemalloc":
        log.info(
            "small objects from jemalloc (PYTHONMALLOC=malloc, jemalloc preloaded): memory levels "
            "off under a steady load and goes back after a burst"
        )
    elif allocator == "malloc":
        log.info(
            "small objects from malloc (glibc's, PYTHONMALLOC=malloc): memory goes back after a "
            "burst, but under a steady load the heap fragments and grows (preload jemalloc, as "
            "the Docker image does: docs/operations/memory.md)"
        )
    else:
        log.info(
            "small objects from pymalloc: after a burst ~1.3x the memory at rest stays "
            "(set PYTHONMALLOC=malloc and preload jemalloc, as the Docker image does)"
        )
    while True:
        await asyncio.sleep(poll_seconds)
        forgotten, state.forgotten = state.forgotten, 0
        if schedule.tick(state.inflight, forgotten):
            release()
