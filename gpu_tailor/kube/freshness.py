"""How current a watched view is: when the API server last showed it so.

Kept apart from ``watch`` (no HTTP client here) so the state a watch keeps can own its freshness.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily

WATCH_WINDOW = 60  # seconds the API server keeps one watch open before it ends it (timeoutSeconds)
QUIET_GRACE = 15  # beyond the window: a stream silent this much longer is broken, and is dropped


def stale_after(window: float = WATCH_WINDOW) -> float:
    """Not heard from for this long, with watch windows of ``window`` seconds: stale. Two windows and their
    grace: a window that ended normally is always followed by a new one that says so."""
    return 2 * (window + QUIET_GRACE)


STALE_AFTER = stale_after()  # not heard from for this long: not ready


class Freshness:
    """When the API server last showed that this view is current: a list completed, a watch window
    opened or ended normally, an event or a bookmark arrived; and since when every try to list or watch
    has failed (None while the last one worked)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last = -math.inf
        self.failing_since: float | None = None

    def heard(self) -> None:
        self.last = self.clock()
        self.failing_since = None

    def failed(self) -> None:
        """A list or watch failed (refused, cut, timed out): the first of a run of failures starts the clock."""
        if self.failing_since is None:
            self.failing_since = self.clock()

    def answered(self) -> None:
        """The API server answered (a page of a list that is still going on): not failing, not yet current."""
        self.failing_since = None

    def failing_for(self) -> float:
        """Seconds every try has failed for (0 while the last one worked)."""
        return 0.0 if self.failing_since is None else self.clock() - self.failing_since

    def staleness(self) -> float:
        """Seconds since the API server was last heard from (infinite before the first list)."""
        return self.clock() - self.last

    def fresh(self, limit: float = STALE_AFTER) -> bool:
        return self.staleness() <= limit


class Staleness:
    """A Prometheus collector: ``<name>{resource}``, the seconds since each watch of ``watches`` last
    heard from the API server (+Inf before its first list)."""

    def __init__(self, name: str, watches: Mapping[str, Freshness]) -> None:
        self.name, self.watches = name, watches

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.name, "Seconds since the API server was last heard from, per watch",
                                   labels=["resource"])
        for resource, fresh in sorted(self.watches.items()):
            family.add_metric([resource], fresh.staleness())
        yield family
