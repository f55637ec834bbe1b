"""The broker's metric families, read and written as text on the event loop in short slices
(:meth:`BrokerMetrics.render`), so that a scrape never holds the loop for long.

Names. Kafka's metrics are named as the Prometheus JMX exporter's standard Kafka rules name
them (``kafka_server_brokertopicmetrics_bytesin_total{topic}``,
``kafka_network_requestmetrics_totaltimems{request,quantile}`` in milliseconds, ...), so that
dashboards and alerts written for Kafka work unchanged. Consumer lag is named as kafka-exporter
names it (``kafka_consumergroup_lag``). What Kafka has no metric for (the WAL, S3, the caches,
the maintenance jobs, the event loop) is under ``automq_``, in seconds and bytes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from automq_py.metrics.consumer_lag import group_lags
from automq_py.metrics.window import QUANTILES, latest, nearest_rank
from automq_py.network.request_metrics import PHASES, api_name
from storage.operator.base import LATENCY_BUCKETS_S, RequestStats

if TYPE_CHECKING:
    from automq_py.broker import Broker

# RequestStats counters by the S3 API they count
S3_OPERATIONS = {
    "put": "PutObject",
    "multipart_create": "CreateMultipartUpload",
    "part": "UploadPart",
    "part_copy": "UploadPartCopy",
    "multipart_complete": "CompleteMultipartUpload",
    "get": "GetObject",
    "head": "HeadObject",
    "delete": "DeleteObjects",
    "list": "ListObjectsV2",
}
TOPIC_COUNTERS = (
    ("bytesin", "bytes_in", "Bytes appended to the topic's partitions"),
    ("bytesout", "bytes_out", "Bytes of the topic's records returned by Fetch"),
    ("messagesin", "messages_in", "Records appended to the topic's partitions"),
    ("totalproducerequests", "produce_requests", "Partition appends asked of the topic"),
    ("failedproducerequests", "failed_produce_requests", "Partition appends refused or failed"),
    ("totalfetchrequests", "fetch_requests", "Partition reads answered for the topic"),
    ("failedfetchrequests", "failed_fetch_requests", "Partition reads that failed"),
)
LOOP_QUANTILES = (0.5, 0.99, 0.999, 1.0)
log = logging.getLogger("automq.metrics")

LINES_PER_SLICE = 200  # text lines written between two turns of the event loop


@dataclass(slots=True)
class _Pending:
    """Quantiles still to compute: of ``samples`` times ``scale``, as ``family``'s samples."""

    family: Metric
    labels: dict[str, str]
    samples: array[float] | list[float]
    scale: float
    quantiles: Sequence[float]


@dataclass(slots=True)
class Scrape:
    families: list[Metric] = field(default_factory=list)
    pending: list[_Pending] = field(default_factory=list)

    def quantiles(
        self,
        family: Metric,
        labels: dict[str, str],
        samples: array[float] | list[float],
        scale: float = 1.0,
        quantiles: Sequence[float] = QUANTILES,
    ) -> None:
        self.pending.append(_Pending(family, labels, samples, scale, quantiles))

    async def finish(self, slices: list[tuple[str, float]]) -> list[Metric]:
        """Compute the quantiles, one window at a time between other work (each one's time
        added to ``slices``), and return every family."""
        for p in self.pending:
            started = time.perf_counter()
            ordered = sorted(p.samples)
            for q in p.quantiles:
                value = nearest_rank(ordered, q * 100) * p.scale if ordered else 0.0
                p.family.add_sample(p.family.name, {**p.labels, "quantile": _q(q)}, value)
            slices.append((f"quantiles {p.family.name}", time.perf_counter() - started))
            await asyncio.sleep(0)
        self.pending = []
        return self.families


def _write(family: Metric, out: list[str]) -> None:
    """``family`` in Prometheus' text format (version 0.0.4), as prometheus-client writes it,
    at a fifth of its cost: one scrape writes a thousand lines and more on the event loop."""
    name = family.name + "_total" if family.type == "counter" else family.name
    doc = family.documentation.replace("\\", "\\\\").replace("\n", "\\n")
    out.append(f"# HELP {name} {doc}\n# TYPE {name} {family.type}\n")
    for sample in family.samples:
        value = _value(sample.value)
        if sample.labels:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sample.labels.items())
            out.append(f"{sample.name}{{{labels}}} {value}\n")
        else:
            out.append(f"{sample.name} {value}\n")


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _value(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if value != value:
        return "NaN"
    return repr(float(value))


def _q(q: float) -> str:
    """A quantile label as the JMX exporter writes Kafka's (``0.99``, ``0.999``)."""
    return f"{q:g}"


class BrokerMetrics:
    def __init__(self, broker: Broker, *, partition_series: bool = True) -> None:
        self.broker = broker
        self.partition_series = partition_series

    async def render(self) -> bytes:
        """Every family in Prometheus' text format. On the event loop, in slices of a
        millisecond or so with the loop's other work between them: from a thread, the same
        work took the interpreter from the loop in 5 ms turns (the GIL's switch interval) for
        as long as it ran, and a scrape a second raised produce p99 at 20 MB/s threefold."""
        scrape = Scrape()
        broker = self.broker
        steps: list[Callable[[Scrape], None]] = [self._requests, self._topics]
        if broker.replicas is not None:
            steps.append(self._partitions)
        steps += [self._groups, self._transactions]
        if broker.storage is not None:
            steps.append(self._storage)
        steps += [self._maintenance, self._process]
        slices: list[tuple[str, float]] = []
        for step in steps:
            started = time.perf_counter()
            step(scrape)
            slices.append((step.__name__, time.perf_counter() - started))
            await asyncio.sleep(0)
        families = await scrape.finish(slices)
        out: list[str] = []
        started, mark = time.perf_counter(), 0
        for family in families:
            _write(family, out)
            if len(out) - mark >= LINES_PER_SLICE:
                slices.append((f"text to {family.name}", time.perf_counter() - started))
                await asyncio.sleep(0)
                started, mark = time.perf_counter(), len(out)
        if log.isEnabledFor(logging.DEBUG):
            longest = sorted(slices, key=lambda s: -s[1])[:5]
            log.debug(
                "scrape: %d slices, %.1f ms on the event loop; longest %s",
                len(slices),
                sum(t for _, t in slices) * 1000,
                ", ".join(f"{name} {t * 1000:.2f} ms" for name, t in longest),
            )
        return "".join(out).encode()

    # -- Kafka's ---------------------------------------------------------------------------

    def _requests(self, scrape: Scrape) -> None:
        server = self.broker.server
        if server is None:
            return
        requests = CounterMetricFamily(
            "kafka_network_requestmetrics_requests",
            "Requests answered, per API and version (Kafka's RequestsPerSec)",
            labels=["request", "version"],
        )
        times = {
            name: Metric(
                f"kafka_network_requestmetrics_{name.lower()}",
                f"Kafka's RequestMetrics {name} over the latest requests, per API",
                "summary",
            )
            for name in ("TotalTimeMs", *PHASES)
        }
        for api_key, api in server.metrics.apis.items():
            request = api_name(api_key)
            for version, n in api.versions.items():
                requests.add_metric([request, str(version)], n)
            for name, window in zip(times, (api.total, *api.phases), strict=True):
                family = times[name]
                labels = {"request": request}
                family.add_sample(family.name + "_count", labels, window.count)
                family.add_sample(family.name + "_sum", labels, window.total * 1000)
                scrape.quantiles(family, labels, window.latest(), 1000)
        scrape.families += [requests, *times.values()]
        count = GaugeMetricFamily(
            "kafka_server_socket_server_metrics_connection_count",
            "Connections open, per listener",
            labels=["listener", "networkProcessor"],
        )
        created = GaugeMetricFamily(
            "kafka_server_socket_server_metrics_connection_creation_total",
            "Connections accepted, per listener",
            labels=["listener", "networkProcessor"],
        )
        for name in server.listener_names:
            count.add_metric([name, "0"], server.connection_count.get(name, 0))
            created.add_metric([name, "0"], server.connections_created.get(name, 0))
        scrape.families += [count, created]

    def _topics(self, scrape: Scrape) -> None:
        replicas = self.broker.replicas
        if replicas is None:
            return
        topics = list(replicas.topic_stats.topics.items())
        for suffix, attribute, doc in TOPIC_COUNTERS:
            family = CounterMetricFamily(
                f"kafka_server_brokertopicmetrics_{suffix}", doc, labels=["topic"]
            )
            every = CounterMetricFamily(f"kafka_server_brokertopicmetrics_{suffix}", doc, labels=[])
            total = 0
            for topic, counters in topics:
                value = getattr(counters, attribute)
                total += value
                family.add_metric([topic], value)
            # the all-topics figure: the same name without the topic label, as Kafka has it
            every.add_metric([], total)
            family.samples += every.samples
            scrape.families.append(family)

    def _partitions(self, scrape: Scrape) -> None:
        broker = self.broker
        assert broker.replicas is not None
        partitions = broker.replicas.open_partitions()
        scrape.families += [
            _gauge(
                "kafka_server_replicamanager_partitioncount", "Partitions open", len(partitions)
            ),
            _gauge(
                "kafka_server_replicamanager_leadercount", "Partitions led here", len(partitions)
            ),
            _gauge(
                "kafka_server_replicamanager_underreplicatedpartitions",
                "Always 0: object storage holds every partition's data",
                0,
            ),
        ]
        if not self.partition_series:
            return
        labels = ["topic", "partition"]
        start = GaugeMetricFamily("kafka_log_log_logstartoffset", "Log start offset", labels=labels)
        end = GaugeMetricFamily("kafka_log_log_logendoffset", "Log end offset", labels=labels)
        size = GaugeMetricFamily("kafka_log_log_size", "Bytes of the log's segments", labels=labels)
        segments = GaugeMetricFamily("kafka_log_log_numlogsegments", "Segments", labels=labels)
        hw = GaugeMetricFamily(
            "kafka_topic_partition_current_offset", "High watermark (kafka-exporter)", labels=labels
        )
        for p in partitions:
            key = [p.topic, str(p.index)]
            start.add_metric(key, p.log_start_offset)
            end.add_metric(key, p.log_end_offset)
            size.add_metric(key, p.log.size_in_bytes)
            segments.add_metric(key, len(p.log.segments))
            hw.add_metric(key, p.high_watermark)
        scrape.families += [start, end, size, segments, hw]

    def _groups(self, scrape: Scrape) -> None:
        broker = self.broker
        groups = broker.groups
        if groups is None:
            return
        prefix = "kafka_coordinator_group_groupmetadatamanager_"
        states: dict[str, int] = {}
        for group_id, group in list(groups.groups.items()):
            state = groups.overview(group_id, group).state
            states[state] = states.get(state, 0) + 1
        scrape.families.append(_gauge(prefix + "numgroups", "Groups", len(groups.groups)))
        for state in ("Stable", "PreparingRebalance", "CompletingRebalance", "Empty", "Dead"):
            scrape.families.append(
                _gauge(
                    f"{prefix}numgroups{state.lower()}",
                    f"Groups in state {state}",
                    states.get(state, 0),
                )
            )
        offsets = sum(len(o) for o in groups.offsets.committed.values())
        scrape.families.append(_gauge(prefix + "numoffsets", "Committed offsets", offsets))
        # consumer lag, as kafka-exporter names it
        replicas = broker.replicas
        if replicas is None:
            return
        ends = {(p.topic, p.index): p.high_watermark for p in replicas.open_partitions()}
        members = GaugeMetricFamily(
            "kafka_consumergroup_members", "Members of the group", labels=["consumergroup"]
        )
        for group_id, group in list(groups.groups.items()):
            members.add_metric([group_id], len(group.members))
        labels = ["consumergroup", "topic", "partition"]
        lag = GaugeMetricFamily(
            "kafka_consumergroup_lag", "High watermark minus committed offset", labels=labels
        )
        current = GaugeMetricFamily(
            "kafka_consumergroup_current_offset", "Committed offset", labels=labels
        )
        lag_sum = GaugeMetricFamily(
            "kafka_consumergroup_lag_sum",
            "The group's lag over the topic's partitions",
            labels=["consumergroup", "topic"],
        )
        for group_id, topic, rows in group_lags(groups.offsets.committed, ends):
            total = 0
            for partition, offset, partition_lag in rows:
                total += partition_lag
                if self.partition_series:
                    key = [group_id, topic, str(partition)]
                    lag.add_metric(key, partition_lag)
                    current.add_metric(key, offset)
            lag_sum.add_metric([group_id, topic], total)
        scrape.families += [members, lag, current, lag_sum]

    def _transactions(self, scrape: Scrape) -> None:
        transactions = self.broker.transactions
        if transactions is None:
            return
        states: dict[str, int] = {}
        for metadata in list(transactions.transactions.values()):
            name = metadata.state.name
            states[name] = states.get(name, 0) + 1
        family = GaugeMetricFamily(
            "automq_transactions",
            "Transactional ids this broker coordinates, per state",
            labels=["state"],
        )
        for state, n in sorted(states.items()):
            family.add_metric([state], n)
        scrape.families.append(family)

    # -- S3Stream's ------------------------------------------------------------------------

    def _storage(self, scrape: Scrape) -> None:
        storage = self.broker.storage
        assert storage is not None
        wal = storage.wal
        stats = wal.stats
        scrape.families += [
            _counter("automq_wal_appends", "Records acknowledged by the WAL", stats.appends),
            _counter(
                "automq_wal_syncs",
                "Durable writes (fsyncs; PUTs of an object WAL)",
                stats.fsyncs,
            ),
            _counter("automq_wal_written_bytes", "Bytes written to the WAL", stats.bytes),
            _gauge("automq_wal_capacity_bytes", "The WAL's capacity", wal.capacity),
            _gauge("automq_wal_free_bytes", "WAL capacity free for appends", wal.free_space),
        ]
        latency = Metric(
            "automq_wal_latency_seconds",
            "WAL latencies over the latest samples: append (submitted to acknowledged), "
            "queue (to taken by the writer), sync (a group commit's durable write)",
            "summary",
        )
        for kind, samples in wal.latency_samples().items():
            scrape.quantiles(latency, {"kind": kind}, latest(samples), 1.0, (0.5, 0.99, 0.999, 1.0))
        scrape.families.append(latency)
        cache = storage.cache
        blocks = storage.block_cache
        scrape.families += [
            _gauge("automq_log_cache_bytes", "Bytes in the LogCache", cache.size),
            _gauge("automq_log_cache_max_bytes", "The LogCache's size limit", cache.max_size),
            _gauge(
                "automq_upload_backlog_bytes",
                "Bytes in the WAL not yet uploaded to object storage",
                cache.unuploaded_size,
            ),
            _counter("automq_uploads", "Stream set objects uploaded", storage.uploads),
            _gauge("automq_block_cache_bytes", "Bytes in the block cache", blocks.size),
            _gauge("automq_block_cache_max_bytes", "The block cache's limit", blocks.max_bytes),
            _counter("automq_block_cache_hits", "Block cache hits", blocks.hits),
            _counter("automq_block_cache_misses", "Block cache misses", blocks.misses),
        ]
        self._s3(scrape, storage.store.stats)

    def _s3(self, scrape: Scrape, stats: RequestStats) -> None:
        requests = CounterMetricFamily(
            "automq_s3_requests", "Object store requests, per S3 API", labels=["operation"]
        )
        counts = stats.snapshot()
        for attribute, operation in S3_OPERATIONS.items():
            requests.add_metric([operation], counts[attribute])
        moved = CounterMetricFamily(
            "automq_s3_bytes", "Payload bytes sent and received", labels=["direction"]
        )
        moved.add_metric(["put"], counts["bytes_put"])
        moved.add_metric(["get"], counts["bytes_get"])
        errors = CounterMetricFamily(
            "automq_s3_request_errors",
            "Attempts that failed (retried or not), per S3 API",
            labels=["operation"],
        )
        duration = Metric(
            "automq_s3_request_duration_seconds",
            "Time of each attempt, per S3 API",
            "histogram",
        )
        for operation, op in sorted(stats.operations.items()):
            errors.add_metric([operation], op.errors)
            cumulative = 0
            for bound, n in zip((*LATENCY_BUCKETS_S, float("inf")), op.buckets, strict=True):
                cumulative += n
                le = "+Inf" if bound == float("inf") else f"{bound:g}"
                duration.add_sample(
                    duration.name + "_bucket", {"operation": operation, "le": le}, cumulative
                )
            duration.add_sample(duration.name + "_count", {"operation": operation}, op.attempts)
            duration.add_sample(duration.name + "_sum", {"operation": operation}, op.micros / 1e6)
        scrape.families += [requests, moved, errors, duration]

    def _maintenance(self, scrape: Scrape) -> None:
        maintenance = self.broker.maintenance
        if maintenance is None:
            return
        runs = CounterMetricFamily(
            "automq_maintenance_runs", "Compaction, retention and GC runs done", labels=["step"]
        )
        failures = CounterMetricFamily(
            "automq_maintenance_failures", "Runs that failed", labels=["step"]
        )
        seconds = CounterMetricFamily(
            "automq_maintenance_seconds", "Time the runs took", labels=["step"]
        )
        totals = CounterMetricFamily(
            "automq_maintenance_work",
            "What the in-process runs did (objects and bytes read, written, deleted)",
            labels=["step", "counter"],
        )
        for step, n in list(maintenance.runs.items()):
            runs.add_metric([step], n)
        for step, n in list(maintenance.failures.items()):
            failures.add_metric([step], n)
        for step, s in list(maintenance.seconds.items()):
            seconds.add_metric([step], s)
        for step, counters in list(maintenance.counters.items()):
            for name, n in list(counters.items()):
                totals.add_metric([step, name], n)
        scrape.families += [runs, failures, seconds, totals]

    # -- the process's ---------------------------------------------------------------------

    def _process(self, scrape: Scrape) -> None:
        broker = self.broker
        lag = Metric(
            "automq_event_loop_lag_seconds",
            "How late the event loop ran a 10 ms timer, over the latest samples",
            "summary",
        )
        scrape.quantiles(lag, {}, latest(broker.loop_lag.samples), 1.0, LOOP_QUANTILES)
        pauses = Metric(
            "automq_gc_pause_seconds",
            "How long the cyclic garbage collector held the interpreter, per generation",
            "summary",
        )
        for generation, samples in enumerate(broker.collector_pauses.pauses):
            labels = {"generation": str(generation)}
            pauses.add_sample(
                pauses.name + "_count", labels, broker.collector_pauses.counts[generation]
            )
            scrape.quantiles(pauses, labels, latest(samples), 1.0, LOOP_QUANTILES)
        scrape.families += [lag, pauses]


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)
