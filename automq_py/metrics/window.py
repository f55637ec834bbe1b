"""The latest samples of a latency in a flat ring of doubles (8 bytes a sample, no object per
sample), with the count and sum of every sample ever recorded: Kafka's histograms, whose
quantiles the JMX exporter publishes, over a window of the latest requests."""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Sequence

QUANTILES = (0.5, 0.75, 0.95, 0.98, 0.99, 0.999)  # Kafka's 50th..999thPercentile
# Quantiles published are of at most this many latest samples: sorting them on a scrape holds
# the interpreter for a quarter of a millisecond (100,000 took 15 ms, which produce latency
# showed).
# Kafka's histograms keep a reservoir of 1,028.
QUANTILE_SAMPLES = 2048


def nearest_rank(ordered: list[float], p: float) -> float:
    """The ``p``-th percentile (0-100) of ``ordered`` (sorted, not empty), nearest rank."""
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


class SampleWindow:
    __slots__ = ("_next", "_ring", "_size", "count", "total")

    def __init__(self, size: int) -> None:
        self._ring = array("d")
        self._size = size
        self._next = 0  # where the next sample goes once the ring is full
        self.count = 0
        self.total = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        ring = self._ring
        if len(ring) < self._size:
            ring.append(value)
            return
        ring[self._next] = value
        self._next = (self._next + 1) % self._size

    def __len__(self) -> int:
        return len(self._ring)

    def latest(self, n: int = QUANTILE_SAMPLES) -> array[float]:
        """The latest ``n`` samples kept, in no order (a flat copy: cheap on the event loop)."""
        ring = self._ring
        if len(ring) <= n:
            return ring[:]
        start = self._next - n if len(ring) == self._size else len(ring) - n
        if start >= 0:
            return ring[start : start + n]
        return ring[start:] + ring[: self._next]

    def samples(self) -> list[float]:
        """The samples kept, oldest first."""
        ring = self._ring
        return ring[self._next :].tolist() + ring[: self._next].tolist()

    def sorted(self) -> list[float]:
        """The samples kept, smallest first (a copy)."""
        return sorted(self._ring)


def latest(samples: Sequence[float], n: int = QUANTILE_SAMPLES) -> list[float]:
    """The latest ``n`` of ``samples`` (a deque or list, oldest first), in no order."""
    if len(samples) <= n:
        return list(samples)
    return list(itertools.islice(reversed(samples), n))
