"""Per-API request times, as Kafka's ``RequestMetrics``: each request's way through the broker
cut where Kafka cuts it, from the moment its last byte was read:

* ``RequestQueueTimeMs``: until its handler starts (behind the connection's earlier requests
  that must finish first);
* ``LocalTimeMs``: the handler's own work, to the response or the deferred answer;
* ``RemoteTimeMs``: waiting on others (the WAL's fsync for acks=all, fetch.min.bytes), until
  the response is written;
* ``ResponseSendTimeMs``: handing the response to the socket;
* ``TotalTimeMs``: all of it. What a client sees beyond it is its own queueing, the network,
  and the event loop's lag in reading.

Each is kept as a :class:`SampleWindow` of the latest requests; the hot path only appends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from automq_py.metrics.window import SampleWindow
from protocol.api_keys import ApiKey

WINDOW = 100_000  # the latest requests of each API kept for TotalTimeMs
PHASE_WINDOW = 10_000  # and for each of its parts
PHASES = ("RequestQueueTimeMs", "LocalTimeMs", "RemoteTimeMs", "ResponseSendTimeMs")
PHASE_NAMES = ("queue", "local", "remote", "send")  # in the summary logged at stop


@dataclass(slots=True)
class ApiTimes:
    """One API's request times (seconds) and how many requests each version had."""

    total: SampleWindow
    phases: tuple[SampleWindow, ...]
    versions: dict[int, int] = field(default_factory=dict)


class RequestMetrics:
    def __init__(
        self, window: int = WINDOW, phase_window: int = PHASE_WINDOW, *, phases: bool = True
    ) -> None:
        """``phases``: keep each request's parts too (with ``metrics.port`` on; the total
        time alone serves the summary logged at stop)."""
        self._window = window
        self._phase_window = phase_window
        self.phases = phases
        self.apis: dict[int, ApiTimes] = {}

    def _times(self, api_key: int) -> ApiTimes:
        times = self.apis.get(api_key)
        if times is None:
            times = self.apis[api_key] = ApiTimes(
                SampleWindow(self._window),
                tuple(SampleWindow(self._phase_window) for _ in PHASES),
            )
        return times

    def record(self, api_key: int, seconds: float) -> None:
        """A request answered without going through a handler (no phases)."""
        self._times(api_key).total.add(seconds)

    def record_request(
        self,
        api_key: int,
        version: int,
        arrived: float,
        started: float,
        handled: float,
        written: float,
        sent: float,
    ) -> None:
        """A request's times (``perf_counter`` seconds): its last byte read, its handler
        started and returned, its response written (all of it before it too), and handed
        to the socket."""
        times = self._times(api_key)
        times.total.add(sent - arrived)
        times.versions[version] = times.versions.get(version, 0) + 1
        if not self.phases:
            return
        queue, local, remote, send = times.phases
        queue.add(started - arrived)
        local.add(handled - started)
        remote.add(written - handled)
        send.add(sent - written)

    def percentiles(self, api_key: int) -> dict[str, float]:
        """p50, p99, p99.9 and max total time in ms over the kept requests (zeros if none)."""
        times = self.apis.get(api_key)
        ordered = times.total.sorted() if times is not None else []
        if not ordered:
            return {"p50": 0.0, "p99": 0.0, "p99.9": 0.0, "max": 0.0}
        p50, p99, p999 = (_rank(ordered, p) * 1000 for p in (50, 99, 99.9))
        return {"p50": p50, "p99": p99, "p99.9": p999, "max": ordered[-1] * 1000}

    def summary(self) -> list[str]:
        """A line per API served, busiest first."""
        lines = []
        for api_key in sorted(self.apis, key=lambda k: -self.apis[k].total.count):
            p = self.percentiles(api_key)
            times = self.apis[api_key]
            line = (
                f"request total time {_enum_name(api_key)}: {times.total.count} "
                f"requests, p50 {p['p50']:.2f} ms, p99 {p['p99']:.2f} ms, p99.9 "
                f"{p['p99.9']:.2f} ms, max {p['max']:.2f} ms"
            )
            if self.phases and len(times.phases[0]):
                parts = []
                for name, window in zip(PHASE_NAMES, times.phases, strict=True):
                    ordered = window.sorted()
                    parts.append(
                        f"{name} {_rank(ordered, 50) * 1000:.2f}/{_rank(ordered, 99) * 1000:.2f}"
                    )
                line += f"; p50/p99 ms over the latest {len(times.phases[0])}: " + ", ".join(parts)
            lines.append(line)
        return lines


def api_name(api_key: int) -> str:
    """Kafka's name of the API (``Produce``, ``ApiVersions``), as RequestMetrics labels it."""
    try:
        return "".join(w.capitalize() for w in ApiKey(api_key).name.split("_"))
    except ValueError:
        return str(api_key)


def _enum_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return str(api_key)


def _rank(ordered: list[float], p: float) -> float:
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]
