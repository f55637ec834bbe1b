"""ClientQuotas: how fast each client may produce, fetch and use the broker, enforced as Kafka's
ClientQuotaManager does.

Each limit has a sensor shared by the clients of the entity that sets it
(:func:`quota_configs.sensor_of`): a token bucket filled at the limit's rate and holding at most
one ``quota.window.size.seconds`` of it. A request's bytes (or, for request quotas, the time its
handling took) are taken from it; when that leaves it in debt, the client is throttled for the
time the debt takes to fill, at most ``quota.window.num`` windows. The response says so in
``throttle_time_ms`` and the connection reads nothing more for that long (KIP-219), so a noisy
client waits and the others are served.

Kafka measures the rate over its ``quota.window.num`` windows instead (a SampledStat), which
lets a client send a whole window's worth (11 s of its quota by default) in a burst each time
its old samples expire: Kafka 4.4 held a producer limited to 1 MB/s to 0.91 and 1.18 MB/s
over 30 s in two runs of ``bench/quota_bench.py``, in bursts of 7 MB. The bucket gives the
same long-run rate with bursts of one window at most.

``controller_mutation_rate`` (KIP-599) limits how many partitions a client creates or deletes
a second (CreateTopics, CreatePartitions, DeleteTopics), in a token bucket holding
``controller.quota.window.num`` windows of it, as Kafka's ControllerMutationQuotaManager keeps
it: a request that finds the bucket in debt is refused THROTTLING_QUOTA_EXCEEDED where its
version knows that error, else taken and throttled (:meth:`ClientQuotas.take_mutations`).

Configs come from the metadata store (:mod:`quota_configs`) and are re-read when they change,
by this broker or another.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from automq_py.security import quota_configs as qc
from storage.metadata.manager import MetadataManager

PRODUCE = "producer_byte_rate"
FETCH = "consumer_byte_rate"
REQUEST = "request_percentage"
MUTATION = "controller_mutation_rate"


@dataclass(slots=True)
class TokenBucket:
    """Tokens (bytes, or ms of handling) filled at ``rate`` per second up to ``capacity``; a
    record takes its value, and a debt is the time until the bucket is back at zero."""

    rate: float
    capacity: float
    tokens: float
    updated_s: float

    def record(self, value: float, now_s: float) -> float:
        """Take ``value`` (give it back if negative); the seconds of debt left, 0 if none."""
        self.tokens = min(self.capacity, self.tokens + (now_s - self.updated_s) * self.rate)
        self.updated_s = now_s
        self.tokens -= value
        return -self.tokens / self.rate if self.tokens < 0 else 0.0


class ClientQuotas:
    def __init__(
        self,
        metadata: MetadataManager,
        window_num: int = 11,
        window_size_s: int = 1,
        clock: Callable[[], float] = time.monotonic,
        mutation_burst_s: float = 11.0,
    ) -> None:
        self._metadata = metadata
        self._window_s = float(window_size_s)
        self._mutation_burst_s = mutation_burst_s
        self._max_throttle_s = window_num * self._window_s
        self._clock = clock
        self._configs: dict[qc.Entity, dict[str, float]] = {}
        # (quota key, user, client id) -> the sensor of the entity that limits them
        self._sensors: dict[tuple[str, str, str], TokenBucket] = {}
        # (quota key, user, client id) -> (limit, sensor key): what limits a client, found once
        self._limits: dict[tuple[str, str, str], tuple[float, tuple[str, str, str]] | None] = {}
        self._reload()
        metadata.add_kv_listener(qc.KV_PREFIX, self._reload)

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
        now = self._clock()
        sensor = self._sensors.get(sensor_key)
        if sensor is None:
            if len(self._sensors) > 100_000:  # (Kafka expires sensors idle for an hour)
                self._sensors.clear()
            burst = bound * self._window_s
            sensor = self._sensors[sensor_key] = TokenBucket(bound, burst, burst, now)
        elif sensor.rate != bound:  # the limit changed
            sensor.rate, sensor.capacity = bound, bound * self._window_s
        debt_s = sensor.record(value, now)
        return int(min(debt_s, self._max_throttle_s) * 1000)

    def take_mutations(
        self, user: str, client_id: str, partitions: int, strict: bool
    ) -> tuple[bool, int]:
        """Take ``partitions`` created or deleted from the client's ``controller_mutation_rate``
        (KIP-599), if it has one: whether they may go ahead, and the ms the client is throttled
        for. ``strict`` (CreateTopics v6+, CreatePartitions v3+, DeleteTopics v5+): refused,
        nothing taken, while the bucket is in debt, as Kafka's StrictControllerMutationQuota
        checks before it records (one request may take the bucket deep into debt); otherwise
        always taken, throttled for the debt left."""
        if not self._configs:
            return True, 0
        limit = self._limit(MUTATION, user, client_id)
        if limit is None:
            return True, 0
        rate, sensor_key = limit
        now = self._clock()
        burst = rate * self._mutation_burst_s
        sensor = self._sensors.get(sensor_key)
        if sensor is None:
            sensor = self._sensors[sensor_key] = TokenBucket(rate, burst, burst, now)
        elif sensor.rate != rate:  # the limit changed
            sensor.rate, sensor.capacity = rate, burst
        if strict:
            debt_s = sensor.record(0, now)
            if debt_s > 0:
                return False, round(debt_s * 1000)
            sensor.record(partitions, now)
            return True, 0
        return True, round(sensor.record(partitions, now) * 1000)

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

    def _reload(self) -> None:
        self._configs = qc.configs(self._metadata.image.kv)
        self._limits.clear()
