"""The store's health as its callers see it, and one line per kind of loss per interval.

Every store operation reports its outcome here (both backends, in the one place each maps its
database's errors: ``_run`` / ``_read``), so ``/readyz`` answers from what requests found, not
from a probe of its own (``proxy/server/http/readiness.py`` probes only when nothing else has read
for a while):

* **Outcomes** per kind: ``session reads`` (a session's durable state: the read every request
  with a session makes before it is forwarded, and the console's session pages; the readiness
  probe reads the same table), ``reads`` (the other reads: transcripts, plans, manifests,
  calibration, sessions lists) and ``writes`` (everything else). ``/readyz`` follows the
  session reads: when they fail, a request gets the "store unavailable" block. The state of a
  kind is the outcome of its most recently *started* operation that has ended: a read that was
  already waiting on a dead connection when the store came back, and fails after a newer read
  succeeded, does not make the store unavailable again. A lock wait that timed out
  (:class:`~proxy.store.base.StoreBusy`) or an error about the data (a conflict, an invalid
  write) means the database answered: it counts as working.
* **Lines.** A change of state is one line (``store unavailable for session reads: ...`` as a
  warning, ``store available again for session reads after 6.2s (812 operations failed)``);
  callers report what an outage cost them with :meth:`StoreHealth.lost` (``store unavailable
  for transcripts: ...; recorded from the session's next request``). Each kind of line is
  written at most once per ``interval`` (10 s); what is held back is reported when the interval ends as ``1519
  similar lines suppressed in the last 10s: store unavailable for transcripts``. Never a
  traceback: an outage is expected, and its cause is the error's class (and SQLSTATE), which
  the store's own messages carry (they never hold a URL, a path or content).

Not thread-safe: used on the event loop (the SQLite backend reports from the loop, not from its
worker threads).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from proxy.core.durable import InvalidWrite
from proxy.store.errors import StoreBusy, StoreError, StoreUnavailable

__all__ = ["INTERVAL_SECONDS", "KINDS", "Kind", "Outcomes", "StoreHealth", "describe"]

log = logging.getLogger("context_proxy.store")

Kind = Literal["session reads", "reads", "writes"]
KINDS: tuple[Kind, ...] = ("session reads", "reads", "writes")
INTERVAL_SECONDS = 10.0


def describe(exc: BaseException) -> str:
    """What a log line may say of a store failure: the store's own message (built to be safe:
    error class and SQLSTATE, field names, never a URL, a path or content), else the class."""
    if isinstance(exc, StoreError | InvalidWrite):
        return str(exc) or type(exc).__name__
    return type(exc).__name__


def _verb(exc: BaseException) -> str:
    if isinstance(exc, StoreBusy):
        return "busy"
    return "unavailable" if isinstance(exc, StoreUnavailable) else "refused an operation"


@dataclass(slots=True)
class Outcomes:
    """One kind's state: the outcome of its most recently started operation that has ended."""

    ok: bool = True
    started: float = -math.inf  # when the operation that decided ``ok`` started
    at: float = -math.inf  # when that outcome was known
    since: float = -math.inf  # when ``ok`` last changed
    failures: int = 0  # operations failed since the last success
    why: str = ""  # the last failure, as :func:`describe` puts it

    def record(self, started: float, now: float, error: str | None) -> bool:
        """Take an outcome (``error`` None: it worked); True when ``ok`` changed."""
        if error is not None:
            self.failures += 1
            self.why = error
        if started < self.started:
            return False  # a newer operation already decided
        self.started, self.at = started, now
        ok = error is None
        if ok:
            self.failures = 0
        if ok == self.ok:
            return False
        self.ok, self.since = ok, now
        return True

    def fresh(self, now: float, max_age: float) -> bool:
        """An outcome was known less than ``max_age`` seconds ago."""
        return now - self.at < max_age


@dataclass(slots=True)
class _Window:
    start: float
    held: int = 0
    flushing: bool = False


class StoreHealth:
    """The outcomes of one store's operations, and its rate-limited outage lines."""

    def __init__(
        self,
        *,
        interval: float = INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
    ) -> None:
        self.outcomes: dict[Kind, Outcomes] = {kind: Outcomes() for kind in KINDS}
        self.interval = interval
        self.clock = clock
        self._log = logger
        self._windows: dict[str, _Window] = {}

    @property
    def ready(self) -> bool:
        """Whether requests' session reads work (``/readyz``)."""
        return self.outcomes["session reads"].ok

    def begin(self) -> float:
        """The start of an operation: pass it to :meth:`ended`."""
        return self.clock()

    def ended(self, kind: Kind, started: float, error: BaseException | None) -> None:
        """An operation of ``kind`` that started at ``started`` ended (``error`` None: it
        worked, or the database answered with an error about the data)."""
        outcomes = self.outcomes[kind]
        now = self.clock()
        failed, down_since = outcomes.failures, outcomes.since
        why = None if error is None else describe(error)
        if not outcomes.record(started, now, why):
            return
        if outcomes.ok:
            self._line(
                logging.INFO,
                f"store available again for {kind}",
                " after %.1fs (%d operations failed)",
                now - down_since,
                failed,
            )
        else:
            self._line(logging.WARNING, f"store unavailable for {kind}", ": %s", why)

    def closed(self) -> None:
        """The store was closed (shutdown): nothing works any more; said by no line."""
        now = self.clock()
        for outcomes in self.outcomes.values():
            outcomes.record(now, now, "the store is closed")

    def lost(self, what: str, exc: BaseException, consequence: str = "") -> None:
        """A caller's line for what the store's failure cost it (``what``: ``transcripts``,
        ``the usage ledger``, ...; ``consequence``: a fixed text of the caller's, never data):
        ``store unavailable for transcripts: the store failed (ConnectionRefusedError);
        recorded from the session's next request``; ``store busy for ...`` (a lock wait),
        ``store refused an operation for ...`` (data it would not take)."""
        suffix = f"; {consequence}" if consequence else ""
        self._line(logging.WARNING, f"store {_verb(exc)} for {what}", ": %s%s", describe(exc), suffix)

    # -- one line per kind per interval -----------------------------------------------------------

    def _line(self, level: int, kind: str, rest: str, *args: object) -> None:
        """``kind`` + ``rest`` % ``args``, unless a line of this kind was written less than
        ``interval`` seconds ago: then it is counted, and the count reported when the interval
        ends (``kind`` is a fixed text of ours: it never holds request data)."""
        now = self.clock()
        window = self._windows.get(kind)
        if window is None or now - window.start >= self.interval:
            if window is not None:
                self._report(kind, window)
            self._windows[kind] = _Window(now)
            self._log.log(level, "%s" + rest, kind, *args)
            return
        window.held += 1
        if window.flushing:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: reported with the next line of this kind
            return
        window.flushing = True
        loop.call_later(window.start + self.interval - now + 0.001, self.flush)

    def flush(self) -> None:
        """Report what was held back in every interval that has ended."""
        now = self.clock()
        for kind, window in self._windows.items():
            if now - window.start >= self.interval:
                self._report(kind, window)

    def _report(self, kind: str, window: _Window) -> None:
        if window.held:
            self._log.warning(
                "%d similar lines suppressed in the last %gs: %s", window.held, self.interval, kind
            )
        window.held = 0
        window.flushing = False
