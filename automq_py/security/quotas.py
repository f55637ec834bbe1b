"""ClientQuotas: how fast each client may produce, fetch and use the broker, enforced as Kafka's
ClientQuotaManager does.

Each limit has a rate sensor shared by the clients of the entity that sets it
(:func:`quota_configs.sensor_of`). A request's bytes (or, for request quotas, the time its
handling took) are recorded, and when the rate over the window (``quota.window.num`` samples of
``quota.window.size.seconds``) is above the limit, the client is throttled for the time that
brings the rate back to it: ``(rate - limit) / limit * window``. The response says so in
``throttle_time_ms`` and the connection reads nothing more for that long (KIP-219), so a noisy
client waits and the others are served.

Configs come from the metadata store (:mod:`quota_configs`) and are re-read when they change,
by this broker or another.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from automq_py.security import quota_configs as qc
from storage.metadata import records as rec
from storage.metadata.manager import MetadataManager

PRODUCE = "producer_byte_rate"
FETCH = "consumer_byte_rate"
REQUEST = "request_percentage"


@dataclass(slots=True)
class Rate:
    """A rate over ``samples`` windows of ``window_ms`` (Kafka's SampledStat Rate): the total
    of the samples over the time they span, and never less than ``samples - 1`` whole windows,
    so a client's first burst is measured over the full window, as Kafka measures it."""

    samples: int
    window_ms: float
    _starts: list[float] = field(default_factory=list)
    _totals: list[float] = field(default_factory=list)

    def record(self, value: float, now_ms: float) -> None:
        self._expire(now_ms)
        if self._starts and now_ms - self._starts[-1] < self.window_ms:
            self._totals[-1] += value
        else:
            self._starts.append(now_ms)
            self._totals.append(value)

    def measure(self, now_ms: float) -> float:
        """The rate per second."""
        self._expire(now_ms)
        return sum(self._totals) / (self.elapsed_ms(now_ms) / 1000)

    def elapsed_ms(self, now_ms: float) -> float:
        elapsed = now_ms - self._starts[0] if self._starts else 0.0
        return max(elapsed, (self.samples - 1) * self.window_ms)

    def _expire(self, now_ms: float) -> None:
        horizon = now_ms - self.samples * self.window_ms
        while self._starts and self._starts[0] <= horizon:
            del self._starts[0]
            del self._totals[0]


class ClientQuotas:
    def __init__(
        self,
        metadata: MetadataManager,
        window_num: int = 11,
        window_size_s: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metadata = metadata
        self._samples = window_num
        self._window_ms = window_size_s * 1000.0
        self._clock = clock
        self._configs: dict[qc.Entity, dict[str, float]] = {}
        # (quota key, user, client id) -> the sensor of the entity that limits them
        self._sensors: dict[tuple[str, str, str], Rate] = {}
        # (quota key, user, client id) -> (limit, sensor key): what limits a client, found once
        self._limits: dict[tuple[str, str, str], tuple[float, tuple[str, str, str]] | None] = {}
        self._reload()
        metadata.add_listener(self._changed)

    @property
    def any(self) -> bool:
        """Whether any quota is set (none: recording is skipped altogether)."""
        return bool(self._configs)

    def record(self, key: str, user: str, client_id: str, value: float) -> int:
        """Record ``value`` (bytes, or handling time in ms for request quotas) for the client;
        the time in ms it is throttled for, 0 if within its limit."""
        if not self._configs:
            return 0
        limit = self._limit(key, user, client_id)
        if limit is None:
            return 0
        bound, sensor_key = limit
        if key == REQUEST:
            bound = bound * 10  # percent of one core as ms per s (100% = 1000 ms/s)
        sensor = self._sensors.get(sensor_key)
        if sensor is None:
            if len(self._sensors) > 100_000:  # (Kafka expires sensors idle for an hour)
                self._sensors.clear()
            sensor = self._sensors[sensor_key] = Rate(self._samples, self._window_ms)
        now = self._clock() * 1000
        sensor.record(value, now)
        rate = sensor.measure(now)
        if rate <= bound:
            return 0
        throttle = (rate - bound) / bound * sensor.elapsed_ms(now)
        return int(min(throttle, self._samples * self._window_ms))

    def limit(self, key: str, user: str, client_id: str) -> float | None:
        """The limit on ``key`` for the client, if any."""
        found = self._limit(key, user, client_id)
        return None if found is None else found[0]

    def _limit(
        self, key: str, user: str, client_id: str
    ) -> tuple[float, tuple[str, str, str]] | None:
        cache_key = (key, user, client_id)
        if cache_key in self._limits:
            return self._limits[cache_key]
        found = None
        for entity in qc.matching_entities(user, client_id):
            value = self._configs.get(entity, {}).get(key)
            if value is not None:
                sensor_user, sensor_client = qc.sensor_of(entity, user, client_id)
                found = (value, (key, sensor_user, sensor_client))
                break
        if len(self._limits) > 100_000:  # client ids are the client's to choose
            self._limits.clear()
        self._limits[cache_key] = found
        return found

    def _changed(self, records: Sequence[rec.Record]) -> None:
        if not records or any(
            isinstance(r, (rec.KVRecord, rec.RemoveKV)) and r.key.startswith(qc.KV_PREFIX)
            for r in records
        ):
            self._reload()

    def _reload(self) -> None:
        self._configs = qc.configs(self._metadata.image.kv)
        self._limits.clear()
