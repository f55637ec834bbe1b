"""Per-API request times, as Kafka's ``RequestMetrics`` ``TotalTimeMs``: from the moment a
request's last byte was read to the moment its response was handed to the socket. What a client
sees beyond it is its own queueing, the network, and the event loop's lag in reading.
"""

from __future__ import annotations

from collections import deque

from automq_py.loop_lag import nearest_rank
from protocol.api_keys import ApiKey

WINDOW = 100_000  # the latest requests of each API kept


class RequestMetrics:
    def __init__(self, window: int = WINDOW) -> None:
        self._window = window
        self._times: dict[int, deque[float]] = {}
        self._counts: dict[int, int] = {}

    def record(self, api_key: int, seconds: float) -> None:
        times = self._times.get(api_key)
        if times is None:
            times = self._times[api_key] = deque(maxlen=self._window)
            self._counts[api_key] = 0
        times.append(seconds)
        self._counts[api_key] += 1

    def percentiles(self, api_key: int) -> dict[str, float]:
        """p50, p99, p99.9 and max total time in ms over the kept requests (zeros if none)."""
        ordered = sorted(self._times.get(api_key, ()))
        if not ordered:
            return {"p50": 0.0, "p99": 0.0, "p99.9": 0.0, "max": 0.0}

        p50, p99, p999 = (nearest_rank(ordered, p) * 1000 for p in (50, 99, 99.9))
        return {"p50": p50, "p99": p99, "p99.9": p999, "max": ordered[-1] * 1000}

    def summary(self) -> list[str]:
        """A line per API served, busiest first."""
        lines = []
        for api_key in sorted(self._counts, key=lambda k: -self._counts[k]):
            p = self.percentiles(api_key)
            try:
                name = ApiKey(api_key).name
            except ValueError:
                name = str(api_key)
            lines.append(
                f"request total time {name}: {self._counts[api_key]} requests, p50 "
                f"{p['p50']:.2f} ms, p99 {p['p99']:.2f} ms, p99.9 {p['p99.9']:.2f} ms, max "
                f"{p['max']:.2f} ms"
            )
        return lines
