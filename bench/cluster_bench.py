"""Cluster bench: automq-py brokers sharing PostgreSQL metadata and one S3 store, measured where
a cluster differs from one broker: moving a partition, a controlled shutdown, spreading a load
over more brokers, and a broker killed.

    python bench/cluster_bench.py [--quick] [--parts throughput move shutdown failover] \
        [--sizes-mib 1 16 256 1024] [--s3-dir /dev/shm] [--keep]

The bench starts a private PostgreSQL (``tests/support/postgres.py``), a SeaweedFS ``weed mini``
(``tests/support/seaweedfs.py``, on ``--s3-base-port``, 24300, or the next free block of 100
ports) and three ``python -m automq_py serve`` processes (``tests/support/broker.py``) with
``metadata.store.url=postgresql://...`` and ``s3.data.buckets`` on that SeaweedFS: each
broker's WAL is a file on this machine's disk (``s3.wal.capacity``, 2 GiB, written with zeros
once), or with ``--wal object`` objects in that SeaweedFS (``s3.wal.path=0@s3://...``), no
maintenance runner (no Spark JVM beside the brokers), the broker's own heartbeat and
session timeouts (2 s, 9 s) unless ``--heartbeat-ms`` / ``--session-ms`` say otherwise. The
three start at once (their WALs are zero-filled together), and each gets ``--settle-s`` before
its first case. Parts, in this order:

* **throughput**: brokers 1 and 2 are stopped again at once, so the cluster has one broker;
  then 2, then 3. With each, a fresh topic of ``--partitions`` (6) is placed on every live
  broker (its leaders are printed), ``--warmup-mib`` goes to a topic of its own, and two
  cases of ``--mib`` each run as ``bench/produce_consume.py`` runs them (its ``produce()``):
  1 KiB records, ``acks=all``, ``linger.ms=5``, round-robin over the partitions, offered at
  ``--rate-mbps`` (20) and saturated. Figures: MB/s, produce() to delivery p50/p99, and each
  broker's CPU seconds (``/proc/<pid>/stat`` utime + stime, its upload worker included) from
  the first produce() to the last acknowledgement, beside the client's, SeaweedFS's and
  PostgreSQL's (every server process of it, exited backends too).
* **move**: for each of ``--sizes-mib`` a 1-partition topic is filled to that size (16 KiB
  records, saturated; the prefill's last part is still in its leader's WAL and LogCache, as on
  a broker that was just written to), then a steady producer (confluent-kafka, ``acks=all``,
  idempotent, a delivery callback per record, one 1 KiB record every millisecond) writes to it
  while the partition is moved ``--moves`` times to another broker with
  AlterPartitionReassignments: ``kafka-reassign-partitions --execute`` in a warm JVM
  (``tests/support/java.py``'s ToolRunner, warmed by two unmeasured moves; a JVM started per
  move would take a core for ~2 s on this machine, in the move), or with ``--admin
  kafka-python``, or when ``.java/`` is missing, kafka-python's
  ``KafkaAdminClient.alter_partition_reassignments``.
* **shutdown**: the same producer on the largest partition, and SIGTERM to the broker leading
  it (a controlled shutdown: its partitions are led elsewhere first); ``--shutdowns`` times,
  the broker started again after each, with the gap while it rejoins (the controller evens out
  leadership when a broker joins, which may move the partition back).
* **failover**: the producer on the same partition, and SIGKILL to its leader (not the
  controller: the partition is moved off the controller first). Detection: the time until a
  surviving broker's Metadata no longer lists the killed broker (fenced, after
  ``broker.session.timeout.ms``). With the file WAL the broker is started again at once: the
  time until it listens, and until the partition takes writes again (its WAL recovered and
  uploaded, its streams closed, the partition opened by its leader). With ``--wal object`` the
  partition fails over without it, and the failover splits, from the brokers' logs, into
  detection (the controller fencing it), the recovery of its WAL objects (the controller
  uploading them and closing its streams) and the reopening on the new leader; then the broker
  is started again.

Before each event the bench waits until every running broker has been listed in Metadata and
the partition's leader has not changed for ``QUIET_S`` (a join's rebalance is over); after it,
until a broker has logged opening the partition, the steady producer has an acknowledgement
after that, and ``AFTER_S`` more. Then, for the event, it prints the **longest gap between two
consecutive acknowledgements** (their times are taken in the delivery callback, served by
``poll()`` every millisecond) and, in ms from the event (the request sent, SIGTERM, SIGKILL):
when that gap began, when the old leader logged closing the partition and the MB it uploaded
before (a reassigned partition's leader first uploads the partition's tail while still serving,
then hands it over; its close uploads what arrived meanwhile, of that partition only), when the
new leader logged opening it, and when acks came
again; the admin call's time (for SIGTERM: until the broker exited) and when Metadata (asked
of the new leader or a surviving broker) first showed the new leader; and for comparison the
longest gap in the ``BASELINE_S`` before, the longest produce() to acknowledgement latency of
the records sent from 1 s before the event on, and the longest gap between two produce() calls
(this process's own stalls). A line per event gives what the brokers logged meanwhile.

A default run takes about 5 minutes on the 2-core VM, ``--quick`` about 2.

MB = 10^6 bytes, MiB = 2^20. Progress goes to stderr, figures to stdout. The client, the
brokers, SeaweedFS and PostgreSQL share this machine's cores.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from automq_py.testing.process import port_free
from bench.produce_consume import Result, child_pids, produce
from tests.support.broker import BrokerProcess
from tests.support.java import JavaSideMissing, ToolRunner, classpath
from tests.support.postgres import PostgresServer
from tests.support.seaweedfs import BENCH_VOLUME_SIZE_LIMIT_MB, SeaweedFS

KiB = 1024
MiB = 1024 * KiB
BROKERS = 3
PARTS = ("throughput", "move", "shutdown", "failover")
S3_BASE_PORT = 24300
STEADY_INTERVAL_S = 0.001  # the steady producer: one record every millisecond
STEADY_RECORD = KiB
PREFILL_RECORD = 16 * KiB
BASELINE_S = 2.0  # the steady producer runs this long before each event
AFTER_S = 3.0  # and this long after writes resumed
EVENT_TIMEOUT_S = 90.0  # an event whose writes do not resume by then is reported as such
POLL_S = 0.02  # Metadata polls while an event runs
QUIET_S = 3.0  # before an event: the brokers listed and the partition's leader unchanged so long
LATENCY_FROM_S = 1.0  # max latency: of the records sent from this long before the event
GOAL_MS = 500.0
GOAL_SPREAD = 2.0  # "flat in size": the sizes' median gaps within this factor of each other


# -- processes ------------------------------------------------------------------------------------


def s3_base_port(wanted: int) -> int:
    """``wanted``, or the next block of 100 ports whose SeaweedFS ports are all free."""
    for base in range(wanted, wanted + 2000, 100):
        if all(port_free(p) for p in (*range(base, base + 9), base + 10008)):
            return base
    raise SystemExit(f"no free SeaweedFS ports from {wanted} on: pick --s3-base-port")


def process_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) so far of ``pid`` and its live children, each with its
    children that have exited (PostgreSQL's backends, a replaced upload worker); 0 when gone."""

    def used(process: int) -> float:
        try:
            with open(f"/proc/{process}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        # utime + stime, and cutime + cstime: the children it has waited for
        return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")

    if pid is None:
        return 0.0
    return used(pid) + sum(used(child) for child in child_pids(pid))


def postmaster_pid(server: PostgresServer) -> int | None:
    try:
        with open(os.path.join(server.data_dir, "postmaster.pid")) as f:
            return int(f.readline())
    except (OSError, ValueError):
        return None


class Cluster:
    """Brokers 0..n-1 over one PostgreSQL database and one SeaweedFS, each restartable."""

    def __init__(
        self, root: Path, s3: SeaweedFS, database: PostgresServer, args: argparse.Namespace
    ) -> None:
        self.s3 = s3
        self.database = database
        common = {
            "cluster.id": f"bench{time.monotonic_ns()}",
            "metadata.store.url": database.create_database(),
            "s3.data.buckets": s3.url(),
            "s3.wal.capacity": str(args.wal_mib * MiB),
            "s3.wal.init.zero": "true",
            "s3.maintenance.runner": "none",
        }
        if args.wal == "object":  # WAL objects in the data bucket, under each node's prefix
            common["s3.wal.path"] = f"0@{s3.url()}"
        if args.heartbeat_ms:
            common["broker.heartbeat.interval.ms"] = str(args.heartbeat_ms)
        if args.session_ms:
            common["broker.session.timeout.ms"] = str(args.session_ms)
        for item in args.broker_config:
            key, _, value = item.partition("=")
            common[key.strip()] = value.strip()
        self.brokers = [
            BrokerProcess(root / f"broker{n}", {**common, "node.id": str(n)})
            for n in range(BROKERS)
        ]
        self.logs = BrokerLogs(self.brokers)

    def start_all(self) -> None:
        """Start every broker at once (their WALs are zero-filled together)."""
        errors: list[BaseException] = []

        def start(broker: BrokerProcess) -> None:
            try:
                broker.start(timeout=120)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=start, args=(b,)) for b in self.brokers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def bootstrap(self, *nodes: int) -> str:
        chosen = nodes or tuple(range(BROKERS))
        return ",".join(self.brokers[n].bootstrap for n in chosen if self.brokers[n].running)

    def live(self) -> list[int]:
        return [n for n, b in enumerate(self.brokers) if b.running]

    def admin(self, *nodes: int) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap(*nodes)})

    def wait_for_brokers(self, nodes: set[int], timeout: float = 60) -> None:
        via = min(self.live())
        admin = self.admin(via)
        deadline = time.monotonic() + timeout
        while set(admin.list_topics(timeout=10).brokers) != nodes:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Metadata lists {sorted(admin.list_topics(timeout=10).brokers)}, "
                    f"not {sorted(nodes)}"
                )
            time.sleep(0.1)

    def controller(self) -> int:
        return int(self.admin().list_topics(timeout=10).controller_id)

    def leaders(self, topic: str, admin: AdminClient | None = None) -> dict[int, int]:
        md = (admin or self.admin()).list_topics(topic, timeout=10).topics[topic]
        return {p.id: p.leader for p in md.partitions.values()}

    def create_topic(self, topic: str, partitions: int) -> dict[int, int]:
        """Create ``topic``; its leaders once every partition has one."""
        admin = self.admin()
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
        deadline = time.monotonic() + 30
        while True:
            md = admin.list_topics(topic, timeout=10).topics.get(topic)
            if (
                md is not None
                and md.error is None
                and len(md.partitions) == partitions
                and all(p.leader >= 0 for p in md.partitions.values())
            ):
                return {p.id: p.leader for p in md.partitions.values()}
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: not every partition has a leader")
            time.sleep(0.1)

    def cpu(self) -> dict[str, float]:
        times = os.times()
        snapshot = {f"b{n}": process_cpu(b.pid) for n, b in enumerate(self.brokers)}
        snapshot["client"] = times.user + times.system
        snapshot["S3"] = process_cpu(self.s3.pid)
        snapshot["PG"] = process_cpu(postmaster_pid(self.database))
        return snapshot

    def stop(self, timeout: float) -> list[str]:
        """Stop every running broker (SIGTERM, SIGKILL after ``timeout``); what went wrong."""
        problems = []
        for n, broker in enumerate(self.brokers):
            if broker.running:
                code = broker.stop(timeout)
                if code != 0:
                    problems.append(f"broker {n} exited with {code}")
        return problems


# -- the steady producer --------------------------------------------------------------------------


class SteadyProducer:
    """One record every ``STEADY_INTERVAL_S`` to one partition, ``acks=all``, idempotent, a
    delivery callback per record: when each was sent and acknowledged (``time.perf_counter``).

    Records are due on a fixed schedule; one the thread is late for is sent at once (at most
    ``CATCH_UP`` at a time), so a stall of this process shows as a gap between sends."""

    CATCH_UP = 20

    def __init__(self, bootstrap: str, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.sent: list[float] = []
        self.acked: list[float] = []  # acknowledgement times, in delivery order
        self.latency: list[float] = []  # produce() to acknowledgement, per acknowledged record
        self.errors: list[str] = []
        self._payload = os.urandom(STEADY_RECORD)
        self._stop = threading.Event()
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 300_000,
            }
        )
        self._thread = threading.Thread(target=self._run, name="steady-producer", daemon=True)

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        now = time.perf_counter()
        if err is not None:
            if len(self.errors) < 20:
                self.errors.append(str(err))
            return
        self.acked.append(now)
        latency = msg.latency()
        self.latency.append(latency if latency is not None else 0.0)

    def _run(self) -> None:
        due = time.perf_counter()
        while not self._stop.is_set():
            now = time.perf_counter()
            if now < due:
                time.sleep(due - now)
                continue
            for _ in range(self.CATCH_UP):
                try:
                    self._producer.produce(
                        self.topic,
                        self._payload,
                        partition=self.partition,
                        on_delivery=self._delivered,
                    )
                except BufferError:
                    break
                self.sent.append(time.perf_counter())
                due += STEADY_INTERVAL_S
                if due > time.perf_counter():
                    break
            else:
                due = time.perf_counter()  # far behind: the schedule starts again from now
            self._producer.poll(0)
        self._producer.flush(120)

    def start(self) -> SteadyProducer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(150)

    def acked_after(self, t: float) -> bool:
        return bool(self.acked) and self.acked[-1] > t

    def wait_acked_after(self, t: float, timeout: float) -> bool:
        """Until an acknowledgement after ``t`` arrives (False: none within ``timeout``)."""
        deadline = time.perf_counter() + timeout
        while not self.acked_after(t):
            if time.perf_counter() > deadline:
                return False
            time.sleep(0.01)
        return True


@dataclass(slots=True)
class Gap:
    """What the steady producer saw around an event at ``at`` (perf_counter seconds)."""

    longest_ms: float  # between two consecutive acknowledgements, the later one after the event
    gap_from_ms: float  # when that gap began, from the event
    baseline_ms: float  # the longest in BASELINE_S before the event
    max_latency_ms: float  # of the records sent from LATENCY_FROM_S before the event on
    send_gap_ms: float  # the longest between two produce() calls from the event on
    resumed_ms: float  # the event to the acknowledgement that ended the longest gap


def gap_around(p: SteadyProducer, at: float, until: float) -> Gap:
    # the callback appends to acked, then to latency: another thread may see one more ack
    n = min(len(p.acked), len(p.latency))
    acked, latency, sent = p.acked[:n], p.latency[:n], list(p.sent)

    def longest(lo: float, hi: float) -> tuple[float, float, float]:
        best = (0.0, lo, lo)
        for a, b in itertools.pairwise(acked):
            if lo <= b <= hi and b - a > best[0]:
                best = (b - a, a, b)
        return best

    gap, start, end = longest(at, until)
    baseline, _, _ = longest(at - BASELINE_S, at)
    late = [lat for t, lat in zip(acked, latency, strict=True) if t - lat >= at - LATENCY_FROM_S]
    sends = [s for s in sent if at <= s <= until]
    send_gap = max((b - a for a, b in itertools.pairwise(sends)), default=0.0)
    return Gap(
        gap * 1e3,
        (start - at) * 1e3,
        baseline * 1e3,
        max(late, default=0.0) * 1e3,
        send_gap * 1e3,
        (end - at) * 1e3,
    )


# -- the brokers' logs ----------------------------------------------------------------------------

LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
# a cache block's upload, or streams' own (a partition's tail before it is handed over)
UPLOADED = re.compile(r"uploaded (?:cache block \d+: )?(\d+) bytes .*? in ([\d.]+) s\b")
TINY_UPLOAD = 100_000  # bytes: uploads below are left out of the printed timelines
CLOSED_MANY = re.compile(r"closed (\d+) partitions led elsewhere now in (\d+) ms")
# log lines shown as they are: a controlled shutdown, a fencing, a failover, a WAL recovery
MARKERS = (
    "controlled shutdown:",
    "fencing broker",
    "was fenced by the controller",
    "partitions away from broker",
    "WAL recovery:",
    "partitions over (",
    "to balance leadership",
)


class BrokerLogs:
    """Every broker's timestamped log lines as ``(time.time() value, text)``, read as the logs
    grow (a restarted broker appends to its log)."""

    def __init__(self, brokers: list[BrokerProcess]) -> None:
        self._brokers = brokers
        self._read_to = [0] * len(brokers)
        self._partial = [b""] * len(brokers)
        self._lines: list[list[tuple[float, str]]] = [[] for _ in brokers]

    def _read(self) -> None:
        for n, broker in enumerate(self._brokers):
            try:
                with open(broker.log_path, "rb") as f:
                    f.seek(self._read_to[n])
                    data = f.read()
            except OSError:
                continue
            self._read_to[n] += len(data)
            *complete, self._partial[n] = (self._partial[n] + data).split(b"\n")
            for raw in complete:
                line = raw.decode(errors="replace")
                if m := LOG_TIME.match(line):
                    stamp = time.mktime(time.strptime(m[1], "%Y-%m-%d %H:%M:%S"))
                    self._lines[n].append((stamp + int(m[2]) / 1e3, line[m.end() :]))

    def lines(self, node: int, since: float, until: float) -> list[tuple[float, str]]:
        self._read()
        return [(t, text) for t, text in self._lines[node] if since <= t <= until]

    def first(self, text: str, since: float) -> tuple[int, float, str] | None:
        """The first line holding ``text`` logged from ``since`` on: (broker, when, line)."""
        self._read()
        found = [
            (t, n, line)
            for n, lines in enumerate(self._lines)
            for t, line in lines
            if t >= since and text in line
        ]
        if not found:
            return None
        t, n, line = min(found)
        return n, t, line

    def opened(self, name: str, since: float) -> tuple[int, float] | None:
        """The first broker to log opening partition ``name`` after ``since``, and when."""
        self._read()
        found = [
            (t, n)
            for n, lines in enumerate(self._lines)
            for t, text in lines
            if t >= since and f"opened partition {name} at epoch" in text
        ]
        return (min(found)[1], min(found)[0]) if found else None


def broker_timeline(cluster: Cluster, name: str, at_wall: float, until_wall: float) -> str:
    """What the brokers logged about the event: uploads, partitions closed, partition ``name``
    opened, a controlled shutdown, a fencing, a WAL recovery; ms from the event."""
    events: list[tuple[float, str]] = []
    for n in range(BROKERS):
        for t, line in cluster.logs.lines(n, at_wall - 0.2, until_wall):
            ms = (t - at_wall) * 1e3
            if m := UPLOADED.search(line):
                if int(m[1]) >= TINY_UPLOAD:  # (a close's upload of nearly nothing: left out)
                    events.append(
                        (ms, f"b{n} uploaded {int(m[1]) / 1e6:.1f} MB in {float(m[2]):.2f} s")
                    )
            elif f"closed partition {name} " in line:
                events.append((ms, f"b{n} closed it"))
            elif m := CLOSED_MANY.search(line):
                events.append((ms, f"b{n} closed {m[1]} partitions ({m[2]} ms)"))
            elif f"opened partition {name} at epoch" in line:
                events.append((ms, f"b{n} opened it"))
            elif f"opening {name} on taking it over" in line:
                events.append((ms, f"b{n} open failed: {line.split(': ', 2)[-1][:80]}"))
            elif any(marker in line for marker in MARKERS):
                events.append((ms, f"b{n} {line.split(': ', 1)[-1][:70]}"))
    events.sort()
    return "; ".join(f"{text} @{ms:+.0f}" for ms, text in events) or "(nothing logged)"


def old_leader_close(
    cluster: Cluster, node: int, name: str, at_wall: float, until_wall: float
) -> tuple[float, float] | None:
    """When broker ``node`` closed the partition after the event (ms from it), and the MB of
    the uploads it finished before (the partition's tail, uploaded while it still served it,
    and its cache blocks' uploads meanwhile); None if it logged no close."""
    lines = cluster.logs.lines(node, at_wall, until_wall)
    closed = next(
        (t for t, text in lines if CLOSED_MANY.search(text) or f"closed partition {name} " in text),
        None,
    )
    if closed is None:
        return None
    uploaded = [int(m[1]) for t, text in lines if t <= closed and (m := UPLOADED.search(text))]
    return (closed - at_wall) * 1e3, sum(uploaded) / 1e6


# -- reassignment ---------------------------------------------------------------------------------


class Reassigner:
    """AlterPartitionReassignments: ``kafka-reassign-partitions --execute`` in a warm JVM, or
    kafka-python's admin client."""

    def __init__(self, how: str, workdir: Path) -> None:
        self.how = how
        self.workdir = workdir
        self._runner = ToolRunner(workdir / "tool-runner.log") if how == "tool" else None
        self._clients: dict[str, Any] = {}

    def move(self, bootstrap: str, topic: str, partition: int, to: int) -> None:
        if self._runner is not None:
            plan = self.workdir / "reassignment.json"
            plan.write_text(
                json.dumps(
                    {
                        "version": 1,
                        "partitions": [{"topic": topic, "partition": partition, "replicas": [to]}],
                    }
                )
            )
            self._runner.run(
                "kafka-reassign-partitions",
                "--bootstrap-server",
                bootstrap,
                "--execute",
                "--reassignment-json-file",
                str(plan),
                timeout=60,
            )
            return
        from kafka import TopicPartition  # type: ignore[import-untyped]
        from kafka.admin import KafkaAdminClient  # type: ignore[import-untyped]

        client = self._clients.get(bootstrap)
        if client is None:
            client = KafkaAdminClient(bootstrap_servers=bootstrap.split(","))
            self._clients[bootstrap] = client
        outcome = client.alter_partition_reassignments({TopicPartition(topic, partition): [to]})
        failed = {str(tp): err for tp, err in outcome.items() if err is not None}
        if failed:
            raise RuntimeError(f"AlterPartitionReassignments: {failed}")

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
        for client in self._clients.values():
            with suppress(Exception):
                client.close()


def reassign_how(args: argparse.Namespace) -> str:
    if args.admin == "tool":
        try:
            classpath()
            return "tool"
        except JavaSideMissing:
            print("# .java/ is missing (make java): moving with kafka-python", file=sys.stderr)
    return "kafka-python"


# -- events ---------------------------------------------------------------------------------------


@dataclass
class Event:
    """One move, shutdown or kill, as the steady producer and an admin client saw it."""

    part: str
    label: str
    gap: Gap | None = None
    call_ms: float | None = None  # the admin call, or the process's exit after SIGTERM
    leader_ms: float | None = None  # the event to Metadata showing the new leader
    brokers: str = ""  # from the brokers' logs
    closed_ms: float | None = None  # the old leader closed the partition (its log)
    uploaded_mb: float | None = None  # what it uploaded first
    opened_ms: float | None = None  # a broker opened the partition (its log)
    extra: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def perf_of(wall: float) -> float:
    """A ``time.time()`` value on the ``time.perf_counter()`` clock."""
    return wall - (time.time() - time.perf_counter())


def wait_leader(
    cluster: Cluster,
    admin: AdminClient,
    topic: str,
    partition: int,
    ok: Callable[[int], bool],
    at: float,
    timeout: float = EVENT_TIMEOUT_S,
) -> float | None:
    """Poll Metadata until the partition's leader satisfies ``ok``: ms from ``at``."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        with suppress(Exception):
            leader = cluster.leaders(topic, admin).get(partition, -1)
            if leader >= 0 and ok(leader):
                return (time.perf_counter() - at) * 1e3
        time.sleep(POLL_S)
    return None


def quiet(cluster: Cluster, topic: str, timeout: float = 60.0) -> str | None:
    """Until every running broker has been listed and the partition's leader unchanged for
    QUIET_S (a join's rebalance, a fencing are over); what was still moving at the timeout."""
    admin = cluster.admin()
    deadline = time.monotonic() + timeout
    last: tuple[frozenset[int], int] | None = None
    since = time.monotonic()
    while time.monotonic() < deadline:
        with suppress(Exception):
            md = admin.list_topics(topic, timeout=5)
            now = (frozenset(md.brokers), md.topics[topic].partitions[0].leader)
            if now != last:
                last, since = now, time.monotonic()
            elif now[0] == frozenset(cluster.live()) and time.monotonic() - since >= QUIET_S:
                return None
        time.sleep(0.2)
    return f"not quiet after {timeout:g} s: Metadata lists {last}"


def finish(
    cluster: Cluster,
    p: SteadyProducer,
    event: Event,
    at: float,
    at_wall: float,
    opened_after: float | None,
    old_leader: int | None = None,
) -> None:
    """Wait until a broker has opened the partition after ``opened_after`` (a ``time.time()``
    value; None: no wait), an acknowledgement after that, and AFTER_S more; then measure."""
    name = f"{p.topic}-{p.partition}"
    resumed_after = at
    if opened_after is not None:
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        while (opened := cluster.logs.opened(name, opened_after)) is None:
            if time.monotonic() > deadline:
                event.notes.append(f"no broker opened {name} within {EVENT_TIMEOUT_S:g} s")
                break
            time.sleep(0.05)
        if opened is not None:
            event.opened_ms = (opened[1] - at_wall) * 1e3
            resumed_after = max(at, perf_of(opened[1]))
    if not p.wait_acked_after(resumed_after, EVENT_TIMEOUT_S):
        event.notes.append(f"no acknowledgement within {EVENT_TIMEOUT_S:g} s")
    time.sleep(AFTER_S)
    until, until_wall = time.perf_counter(), time.time()
    event.gap = gap_around(p, at, until)
    event.brokers = broker_timeline(cluster, name, at_wall, until_wall)
    if old_leader is not None and (
        closed := old_leader_close(cluster, old_leader, name, at_wall, until_wall)
    ):
        event.closed_ms, event.uploaded_mb = closed
    if p.errors:
        event.notes.append(f"delivery errors: {p.errors[:3]}")


def move_once(cluster: Cluster, reassigner: Reassigner, p: SteadyProducer, label: str) -> Event:
    """Move the partition to the next broker after its leader."""
    event = Event("move", label)
    if unsettled := quiet(cluster, p.topic):
        event.notes.append(unsettled)
    old_leader = cluster.leaders(p.topic)[p.partition]
    to = other_broker(cluster, old_leader)
    print(f"# moving {p.topic} from b{old_leader} to b{to}", file=sys.stderr)
    admin = cluster.admin(to)
    done: list[float] = []
    failure: list[BaseException] = []

    def call() -> None:
        try:
            reassigner.move(cluster.bootstrap(), p.topic, p.partition, to)
            done.append(time.perf_counter())
        except BaseException as e:
            failure.append(e)

    at, at_wall = time.perf_counter(), time.time()
    caller = threading.Thread(target=call, name="reassign")
    caller.start()
    event.leader_ms = wait_leader(cluster, admin, p.topic, p.partition, lambda n: n == to, at)
    caller.join(EVENT_TIMEOUT_S)
    if failure:
        raise failure[0]
    if done:
        event.call_ms = (done[0] - at) * 1e3
    finish(cluster, p, event, at, at_wall, at_wall, old_leader)
    return event


# -- the parts ------------------------------------------------------------------------------------


def fill(bootstrap: str, topic: str, mib: int) -> None:
    """``mib`` MiB of PREFILL_RECORD records into partition 0, as fast as acknowledged."""
    count = mib * MiB // PREFILL_RECORD
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    payload = os.urandom(PREFILL_RECORD)
    bar = tqdm(total=mib, desc=f"fill {topic}", unit="MiB", leave=False, file=sys.stderr)
    i = 0

    def show() -> None:
        bar.n = (i - len(producer)) * PREFILL_RECORD // MiB  # acknowledged so far
        bar.refresh()

    try:
        while i < count:
            try:
                producer.produce(topic, payload, partition=0)
                i += 1
            except BufferError:
                producer.poll(0.05)
                show()
                continue
            if i % 64 == 0:
                producer.poll(0)
                show()
        deadline = time.monotonic() + 300
        while len(producer) and time.monotonic() < deadline:
            producer.poll(0.1)
            show()
        if len(producer):
            raise RuntimeError(f"{topic}: the fill was not acknowledged within 300 s")
    finally:
        bar.close()


def other_broker(cluster: Cluster, leader: int, avoid: int | None = None) -> int:
    """The next live broker after ``leader`` (not ``avoid`` when there is a choice)."""
    live = cluster.live()
    at = live.index(leader) if leader in live else -1
    order = live[at + 1 :] + live[: at + 1]
    order = [n for n in order if n != leader]
    for n in order:
        if n != avoid:
            return n
    return order[0]


def run_moves(
    cluster: Cluster, args: argparse.Namespace, reassigner: Reassigner, events: list[Event]
) -> str:
    """Part ``move``; returns the topic of the largest size, for the next parts."""
    warm = f"warm-{time.monotonic_ns()}"
    leader = cluster.create_topic(warm, 1)[0]
    for _ in range(2):  # the JVM's (or client's) first reassignment, unmeasured
        leader = other_broker(cluster, leader)
        reassigner.move(cluster.bootstrap(), warm, 0, leader)
        # a reassignment completes behind the call: the next one for the partition waits for
        # it (kafka-reassign-partitions refuses to start one while another is pending)
        deadline = time.monotonic() + 30
        while cluster.leaders(warm)[0] != leader:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{warm}: not moved to b{leader} within 30 s")
            time.sleep(0.05)
    largest = ""
    for mib in args.sizes_mib:
        topic = f"move-{mib}mib-{time.monotonic_ns()}"
        if mib == max(args.sizes_mib):
            largest = topic
        cluster.create_topic(topic, 1)
        fill(cluster.bootstrap(), topic, mib)
        p = SteadyProducer(cluster.bootstrap(), topic, 0).start()
        try:
            time.sleep(BASELINE_S)
            for move in range(1, args.moves + 1):
                event = move_once(cluster, reassigner, p, f"{mib} MiB, move {move}")
                event.extra["size_mib"] = mib
                events.append(event)
        finally:
            p.stop()
    return largest


def not_controller(cluster: Cluster, reassigner: Reassigner, topic: str) -> None:
    """Have the partition led by a broker that is not the controller (an unmeasured move)."""
    leader, controller = cluster.leaders(topic)[0], cluster.controller()
    if leader == controller:
        to = other_broker(cluster, leader, avoid=controller)
        reassigner.move(cluster.bootstrap(), topic, 0, to)
        wait_leader(cluster, cluster.admin(to), topic, 0, lambda n: n == to, time.perf_counter())


def run_shutdowns(
    cluster: Cluster, args: argparse.Namespace, topic: str, events: list[Event]
) -> None:
    p = SteadyProducer(cluster.bootstrap(), topic, 0).start()
    try:
        for round_ in range(1, args.shutdowns + 1):
            victim = shutdown_once(cluster, p, round_, events)
            rejoin_once(cluster, p, victim, round_, events)
    finally:
        p.stop()


def shutdown_once(cluster: Cluster, p: SteadyProducer, round_: int, events: list[Event]) -> int:
    """SIGTERM to the partition's leader; returns which broker it was."""
    unsettled = quiet(cluster, p.topic)
    time.sleep(BASELINE_S)
    victim = cluster.leaders(p.topic)[0]
    role = ", the controller" if victim == cluster.controller() else ""
    admin = cluster.admin(other_broker(cluster, victim))
    print(f"# SIGTERM to b{victim}{role}, leading {p.topic}", file=sys.stderr)
    event = Event("shutdown", f"SIGTERM b{victim}{role}, #{round_}")
    if unsettled:
        event.notes.append(unsettled)
    broker = cluster.brokers[victim]
    exits: list[tuple[int, float]] = []

    def stop() -> None:
        code = broker.stop(120)
        exits.append((code, time.perf_counter()))

    at, at_wall = time.perf_counter(), time.time()
    stopper = threading.Thread(target=stop, name="sigterm")
    stopper.start()
    event.leader_ms = wait_leader(cluster, admin, p.topic, 0, lambda n: n != victim, at)
    finish(cluster, p, event, at, at_wall, at_wall, victim)
    stopper.join(150)
    if exits:
        event.call_ms = (exits[0][1] - at) * 1e3
        if exits[0][0] != 0:
            event.notes.append(f"b{victim} exited with {exits[0][0]}")
    else:
        event.notes.append(f"b{victim} had not exited 150 s after SIGTERM")
    events.append(event)
    return victim


def rejoin_once(
    cluster: Cluster, p: SteadyProducer, victim: int, round_: int, events: list[Event]
) -> None:
    """The broker started again: the controller evens leadership out when it joins, which may
    move the partition back to it."""
    admin = cluster.admin(other_broker(cluster, victim))
    event = Event("shutdown", f"b{victim} rejoins, #{round_}")
    before = cluster.leaders(p.topic, admin)[0]
    at, at_wall = time.perf_counter(), time.time()
    cluster.brokers[victim].start(timeout=120)
    cluster.wait_for_brokers(set(range(BROKERS)))
    event.extra["listed_ms"] = (time.perf_counter() - at) * 1e3
    if unsettled := quiet(cluster, p.topic):
        event.notes.append(unsettled)
    after = cluster.leaders(p.topic, admin)[0]
    moved = after != before
    finish(cluster, p, event, at, at_wall, at_wall if moved else None, before if moved else None)
    event.notes.append(
        f"partition led by b{before}, then b{after}"
        + (" (moved by the rebalance)" if moved else "")
    )
    events.append(event)


def run_failover(
    cluster: Cluster, reassigner: Reassigner, topic: str, events: list[Event], wal: str
) -> None:
    not_controller(cluster, reassigner, topic)
    p = SteadyProducer(cluster.bootstrap(), topic, 0).start()
    try:
        unsettled = quiet(cluster, topic)
        time.sleep(BASELINE_S)
        victim = cluster.leaders(topic)[0]
        role = ", the controller" if victim == cluster.controller() else ""
        admin = cluster.admin(other_broker(cluster, victim))
        print(f"# SIGKILL to b{victim}{role}, leading {topic}", file=sys.stderr)
        event = Event("failover", f"SIGKILL b{victim}{role}, {wal} WAL")
        if unsettled:
            event.notes.append(unsettled)
        at, at_wall = time.perf_counter(), time.time()
        cluster.brokers[victim].kill()
        detected = leader_moved = None
        deadline = at + EVENT_TIMEOUT_S
        while (detected is None or leader_moved is None) and time.perf_counter() < deadline:
            with suppress(Exception):
                md = admin.list_topics(topic, timeout=5)
                now = (time.perf_counter() - at) * 1e3
                if detected is None and victim not in md.brokers:
                    detected = now
                if leader_moved is None and md.topics[topic].partitions[0].leader not in (
                    victim,
                    -1,
                ):
                    leader_moved = now
            time.sleep(POLL_S)
        if detected is None:
            event.notes.append(f"b{victim} still listed after {EVENT_TIMEOUT_S:g} s")
        event.extra["fenced_ms"] = detected or float("nan")
        event.leader_ms = leader_moved
        if wal == "object":
            # served again without it: its WAL objects recovered by the controller
            finish(cluster, p, event, at, at_wall, at_wall)
            for key, text in (
                ("fencing_ms", f"fencing broker {victim} "),
                ("recovered_ms", f"recovered node {victim}'s WAL"),
            ):
                if found := cluster.logs.first(text, at_wall):
                    event.extra[key] = (found[1] - at_wall) * 1e3
            cluster.brokers[victim].start(timeout=120)  # back for what follows
        else:
            restart, restart_wall = time.perf_counter(), time.time()
            event.extra["restart_at_ms"] = (restart - at) * 1e3
            cluster.brokers[victim].start(timeout=120)
            event.extra["listening_ms"] = (time.perf_counter() - restart) * 1e3
            finish(cluster, p, event, at, at_wall, restart_wall)
            opened = event.opened_ms
            since = restart if opened is None else at + opened / 1e3
            first = next((t for t in p.acked if t > since), None)
            if first is not None:
                event.extra["writes_ms"] = (first - restart) * 1e3
        events.append(event)
        cluster.wait_for_brokers(set(range(BROKERS)))
    finally:
        p.stop()


def produce_options(args: argparse.Namespace, rate: float) -> argparse.Namespace:
    """``bench/produce_consume.py``'s options for its ``produce()``: 1 KiB records, at most
    16 MiB awaiting acknowledgement, ``linger.ms=5``, at ``rate`` MB/s (0: saturated)."""
    return argparse.Namespace(
        record_size=KiB,
        window_mib=16,
        rate_mbps=rate,
        timeout=args.timeout,
        linger_ms=5,
        timeline=False,
    )


@dataclass
class ThroughputRow:
    brokers: int
    case: str
    leaders: str
    result: Result
    cpu: dict[str, float]
    wall_s: float


def throughput_case(
    cluster: Cluster, args: argparse.Namespace, n: int, rate: float, rows: list[ThroughputRow]
) -> None:
    topic = f"load-{n}b-{'rate' if rate else 'sat'}-{time.monotonic_ns()}"
    leaders = cluster.create_topic(topic, args.partitions)
    spread = Counter(leaders.values())
    time.sleep(1.0)  # the partitions open in the background
    case = f"{rate:g} MB/s" if rate else "saturated"
    name = f"{n} broker{'s' if n > 1 else ''} {case}"
    result = Result(name, args.partitions, args.mib * MiB // KiB)
    options = produce_options(args, rate)
    before, started = cluster.cpu(), time.perf_counter()
    used: dict[str, float] = {}
    wall: list[float] = []

    def produced() -> None:
        after = cluster.cpu()
        used.update({k: after[k] - before.get(k, 0.0) for k in after})
        wall.append(time.perf_counter() - started)

    produce(cluster.bootstrap(), topic, args.partitions, options, result, produced)
    rows.append(
        ThroughputRow(
            n,
            case,
            " ".join(f"b{b}:{c}" for b, c in sorted(spread.items())),
            result,
            used,
            wall[0] if wall else 0.0,
        )
    )


def warm_up(cluster: Cluster, args: argparse.Namespace) -> None:
    if args.warmup_mib <= 0:
        return
    topic = f"warmup-{time.monotonic_ns()}"
    cluster.create_topic(topic, args.partitions)
    result = Result("warm-up", args.partitions, args.warmup_mib * MiB // KiB)
    produce(cluster.bootstrap(), topic, args.partitions, produce_options(args, 0.0), result)


def run_throughput(cluster: Cluster, args: argparse.Namespace, rows: list[ThroughputRow]) -> None:
    for n in range(1, BROKERS + 1):
        if n > 1:
            cluster.brokers[n - 1].start(timeout=120)
            cluster.wait_for_brokers(set(range(n)))
            time.sleep(args.join_settle_s)  # the controller's rebalance on the join
            cluster.wait_for_brokers(set(range(n)))  # (listed again if fenced meanwhile)
        print(f"# throughput with {n} broker(s)", file=sys.stderr)
        warm_up(cluster, args)
        for rate in (args.rate_mbps, 0.0):
            throughput_case(cluster, args, n, rate, rows)


# -- output ---------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Columns aligned, the first to the left, the others (figures) to the right."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    print(line(headers))
    for r in rows:
        print(line(r))


def between(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


def ms(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.0f}"


def print_throughput(rows: list[ThroughputRow], args: argparse.Namespace) -> None:
    print()
    print(
        f"## produce throughput, {args.partitions} partitions over the live brokers, "
        f"{args.mib} MiB of 1 KiB records per case, acks=all, linger.ms=5"
    )
    cores = os.cpu_count()
    print(
        f"# this machine has {cores} cores: the client, every broker, SeaweedFS and PostgreSQL "
        "share them, so more brokers add no CPU here; the figures show what spreading a load "
        "costs, not how a cluster of machines scales"
    )
    headers = [
        "brokers",
        "case",
        "leaders",
        "MB/s",
        "p50 ms",
        "p99 ms",
        "CPU s b0/b1/b2",
        "brokers CPU s/GB",
        "brokers cores",
        "client",
        "S3",
        "PG",
    ]
    out = []
    for r in rows:
        res = r.result
        gb = res.produced * KiB / 1e9
        brokers = [r.cpu.get(f"b{n}", 0.0) for n in range(BROKERS)]
        per_gb = sum(brokers) / gb if gb else None
        out.append(
            [
                str(r.brokers),
                r.case,
                r.leaders,
                "-" if res.produce_mbs is None else f"{res.produce_mbs:.1f}",
                "-" if res.p50_ms is None else f"{res.p50_ms:.1f}",
                "-" if res.p99_ms is None else f"{res.p99_ms:.1f}",
                "/".join(f"{c:.1f}" for c in brokers[: r.brokers]),
                "-" if per_gb is None else f"{per_gb:.1f}",
                f"{sum(brokers) / r.wall_s:.2f}" if r.wall_s else "-",
                f"{r.cpu.get('client', 0.0):.1f}",
                f"{r.cpu.get('S3', 0.0):.1f}",
                f"{r.cpu.get('PG', 0.0):.1f}",
            ]
        )
    table(headers, out)
    for r in rows:
        for note in r.result.notes:
            print(f"# {r.result.broker}: {note}")


EVENT_HEADERS = (
    "event",
    "ack gap",
    "acks stopped",
    "old leader closed",
    "uploaded first MB",
    "new leader opened",
    "acks again",
    "admin call",
    "in Metadata",
    "baseline gap",
    "max latency",
    "send gap",
)


def event_row(e: Event) -> list[str]:
    g = e.gap
    return [
        e.label,
        ms(g.longest_ms if g else None),
        ms(g.gap_from_ms if g else None),
        ms(e.closed_ms),
        "-" if e.uploaded_mb is None else f"{e.uploaded_mb:.1f}",
        ms(e.opened_ms),
        ms(g.resumed_ms if g else None),
        ms(e.call_ms),
        ms(e.leader_ms),
        ms(g.baseline_ms if g else None),
        ms(g.max_latency_ms if g else None),
        ms(g.send_gap_ms if g else None),
    ]


def print_events(events: list[Event], args: argparse.Namespace) -> None:
    titles = {
        "move": f"## partition moved with AlterPartitionReassignments ({args.admin_used})",
        "shutdown": "## controlled shutdown (SIGTERM) of the partition's leader, and its return",
        "failover": f"## kill -9 of the partition's leader ({args.wal} WAL)",
    }
    for part, title in titles.items():
        chosen = [e for e in events if e.part == part]
        if not chosen:
            continue
        print()
        print(title)
        print(
            "# ms; acks stopped, old leader closed, new leader opened, acks again, admin call "
            "and in Metadata count from the event (the request sent, SIGTERM, SIGKILL)"
        )
        table(EVENT_HEADERS, [event_row(e) for e in chosen])
        for e in chosen:
            extra = ", ".join(f"{k} {v:.0f}" for k, v in e.extra.items() if k != "size_mib")
            print(f"# {e.label}: {e.brokers}" + (f"; {extra}" if extra else ""))
            for note in e.notes:
                print(f"#   {note}")
        if part == "move":
            judge_moves(chosen)
        if part == "shutdown":
            print("# admin call: SIGTERM to the broker's exit")
        if part == "failover" and args.wal == "object":
            for e in chosen:
                fencing, recovered = e.extra.get("fencing_ms"), e.extra.get("recovered_ms")
                longest = e.gap.longest_ms if e.gap else None
                print(
                    f"# {e.label}: fenced by the controller after {ms(fencing)} ms (detection), "
                    f"its WAL recovered {ms(between(fencing, recovered))} ms later, the "
                    f"partition reopened {ms(between(recovered, e.opened_ms))} ms after that; "
                    f"the longest gap between acks {ms(longest)} ms"
                )
        elif part == "failover":
            for e in chosen:
                restart = e.extra.get("restart_at_ms", 0.0)
                print(
                    f"# {e.label}: detection (fenced, gone from Metadata) "
                    f"{ms(e.extra.get('fenced_ms'))} ms; restarted at once: listening after "
                    f"{ms(e.extra.get('listening_ms'))} ms, the partition opened after "
                    f"{ms(None if e.opened_ms is None else e.opened_ms - restart)} ms and took "
                    f"writes after {ms(e.extra.get('writes_ms'))} ms (recovery and reopen)"
                )
            print(
                "# with the file WAL a killed broker's unuploaded records are on its disk only: "
                "its partitions come back when it does (--wal object fails over without it)"
            )


def judge_moves(events: list[Event]) -> None:
    """The goal: every gap under GOAL_MS, and flat in the partition's size."""
    measured = [e for e in events if e.gap is not None]
    if not measured:
        return
    over = [e for e in measured if e.gap is not None and e.gap.longest_ms >= GOAL_MS]
    worst = max(e.gap.longest_ms for e in measured if e.gap is not None)
    print(
        f"# goal, every gap under {GOAL_MS:.0f} ms: "
        + ("met" if not over else f"NOT met, {len(over)} of {len(measured)} moves over it")
        + f" (longest {worst:.0f} ms)"
    )
    by_size: dict[float, list[float]] = {}
    for e in measured:
        if e.gap is not None:
            by_size.setdefault(e.extra["size_mib"], []).append(e.gap.longest_ms)
    medians = {size: statistics.median(gaps) for size, gaps in sorted(by_size.items())}
    spread = max(medians.values()) / max(min(medians.values()), 1.0)
    print(
        "# median gap per size: "
        + ", ".join(f"{size:g} MiB {gap:.0f} ms" for size, gap in medians.items())
        + f": {spread:.1f}x apart, "
        + ("flat" if spread <= GOAL_SPREAD else "NOT flat")
    )
    handover = [
        e.opened_ms - e.closed_ms
        for e in measured
        if e.opened_ms is not None and e.closed_ms is not None
    ]
    closing = [
        e.closed_ms - e.gap.gap_from_ms
        for e in measured
        if e.closed_ms is not None and e.gap is not None
    ]
    if handover and closing:
        print(
            f"# of a gap: the old leader closing the partition (acks stopped to closed) median "
            f"{statistics.median(closing):.0f} ms, max {max(closing):.0f}; closed to opened by "
            f"the new leader median {statistics.median(handover):.0f} ms, max "
            f"{max(handover):.0f}"
        )


# -- main -----------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="sizes 1 and 64 MiB, one move each, 64 MiB per throughput case, "
        "a 512 MiB WAL, 5 s settle (under 3 minutes)",
    )
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=PARTS,
        default=list(PARTS),
        help="what to run (in this order whatever the order given)",
    )
    parser.add_argument(
        "--sizes-mib",
        type=int,
        nargs="+",
        default=[1, 16, 256, 1024],
        help="partition sizes for the moves, MiB",
    )
    parser.add_argument(
        "--moves",
        type=int,
        default=2,
        help="moves per size (the first also uploads the fill's unuploaded tail)",
    )
    parser.add_argument("--shutdowns", type=int, default=2, help="controlled shutdowns")
    parser.add_argument(
        "--admin",
        choices=("tool", "kafka-python"),
        default="tool",
        help="how to reassign: kafka-reassign-partitions (needs .java/, make "
        "java) or kafka-python's alter_partition_reassignments",
    )
    parser.add_argument("--partitions", type=int, default=6, help="throughput: partitions")
    parser.add_argument("--mib", type=int, default=256, help="throughput: MiB per case")
    parser.add_argument(
        "--rate-mbps", type=float, default=20.0, help="throughput: the fixed-rate case, MB/s"
    )
    parser.add_argument(
        "--warmup-mib",
        type=int,
        default=32,
        help="throughput: unmeasured MiB before each broker count's cases",
    )
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per produce case")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=20.0,
        help="after the brokers start (their WALs were just written with zeros)",
    )
    parser.add_argument(
        "--join-settle-s",
        type=float,
        default=10.0,
        help="throughput: after a broker joins, before its cases",
    )
    parser.add_argument("--wal-mib", type=int, default=2048, help="s3.wal.capacity per broker")
    parser.add_argument(
        "--wal",
        choices=["file", "object"],
        default="file",
        help="the brokers' WAL: a file each, or objects in the S3 store (s3.wal.path 0@s3://): "
        "then a killed broker's partitions fail over without it",
    )
    parser.add_argument(
        "--heartbeat-ms",
        type=int,
        default=0,
        help="broker.heartbeat.interval.ms (0: the broker's default, 2000)",
    )
    parser.add_argument(
        "--session-ms",
        type=int,
        default=0,
        help="broker.session.timeout.ms (0: the broker's default, 9000)",
    )
    parser.add_argument(
        "--broker-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a broker property (repeatable)",
    )
    parser.add_argument(
        "--s3-dir",
        metavar="DIR",
        help="where SeaweedFS keeps its data (default: the work directory); "
        "/dev/shm keeps its writes off the WAL's disk",
    )
    parser.add_argument(
        "--s3-base-port",
        type=int,
        default=S3_BASE_PORT,
        help="SeaweedFS's first port (the next free block of 100 if taken)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args()
    if args.quick:
        args.sizes_mib, args.moves, args.shutdowns = [1, 64], 1, 1
        args.mib, args.warmup_mib, args.wal_mib, args.settle_s = 64, 16, 512, 5.0
        args.join_settle_s = 5.0
    return args


@contextmanager
def servers(root: Path, args: argparse.Namespace) -> Iterator[tuple[SeaweedFS, PostgresServer]]:
    """A PostgreSQL and a SeaweedFS, both stopped and their directories removed at the end."""
    s3_parent = (
        Path(tempfile.mkdtemp(prefix="automq-cluster-bench-s3-", dir=args.s3_dir))
        if args.s3_dir
        else root
    )
    s3: SeaweedFS | None = None
    database = PostgresServer()
    try:
        with database:
            s3 = start_seaweedfs(s3_parent / "s3", args.s3_base_port)
            yield s3, database
    finally:
        if s3 is not None:
            s3.stop()
        if s3_parent != root:
            shutil.rmtree(s3_parent, ignore_errors=True)


def start_seaweedfs(root: Path, base_port: int) -> SeaweedFS:
    """SeaweedFS on the first block of free ports from ``base_port``. Its admin gRPC port (base
    + 10008) is in the kernel's ephemeral range, where a client's connection may take it
    between the check and the start: then the next block is tried."""
    base = base_port
    for _ in range(5):
        s3 = SeaweedFS(
            root, base_port=s3_base_port(base), volume_size_limit_mb=BENCH_VOLUME_SIZE_LIMIT_MB
        )
        try:
            s3.start()
            return s3
        except RuntimeError as e:
            if "are taken" not in str(e):
                raise
            base = s3.base_port + 100
    raise SystemExit(f"no free SeaweedFS ports from {base_port} on: pick --s3-base-port")


def main() -> None:
    args = parse_args()
    args.admin_used = reassign_how(args) if {"move", "failover"} & set(args.parts) else "-"
    # a SIGTERM unwinds like Ctrl-C: every process stopped, every directory removed
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    root = Path(tempfile.mkdtemp(prefix="automq-cluster-bench-"))
    events: list[Event] = []
    rows: list[ThroughputRow] = []
    problems: list[str] = []
    started = time.monotonic()
    try:
        with servers(root, args) as (s3, database):
            print(
                f"# cluster bench, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores "
                f"(load average {os.getloadavg()[0]:.1f}), {BROKERS} brokers, PostgreSQL "
                f"metadata, SeaweedFS {s3.endpoint}, {args.wal} WALs of {args.wal_mib} MiB; parts "
                f"{' '.join(p for p in PARTS if p in args.parts)}",
                flush=True,
            )
            cluster = Cluster(root, s3, database, args)
            try:
                run(cluster, args, root, rows, events)
                print("# stopping the brokers", file=sys.stderr)
                problems += cluster.stop(120)
            finally:
                if any(b.running for b in cluster.brokers):  # an error or Ctrl-C
                    for n, broker in enumerate(cluster.brokers):
                        print(
                            f"--- broker {n}, log tail ---\n{broker.log_tail(15)}", file=sys.stderr
                        )
                    cluster.stop(10)
        if rows:
            print_throughput(rows, args)
        print_events(events, args)
        for problem in problems:
            print(f"# {problem}")
        print(
            f"# took {time.monotonic() - started:.0f} s; load average at the end "
            + " ".join(f"{x:.1f}" for x in os.getloadavg())
            + " (1, 5, 15 min)"
        )
    finally:
        if args.keep or problems:
            print(f"# work directory kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


def run(
    cluster: Cluster,
    args: argparse.Namespace,
    root: Path,
    rows: list[ThroughputRow],
    events: list[Event],
) -> None:
    print("# starting 3 brokers", file=sys.stderr)
    cluster.start_all()
    cluster.wait_for_brokers(set(range(BROKERS)))
    if "throughput" in args.parts:  # one broker first: the others stop again (WALs written)
        for n in range(1, BROKERS):
            cluster.brokers[n].stop(120)
        cluster.wait_for_brokers({0})
    print(f"# settling {args.settle_s:g} s", file=sys.stderr)
    time.sleep(args.settle_s)
    if "throughput" in args.parts:
        run_throughput(cluster, args, rows)
    if not {"move", "shutdown", "failover"} & set(args.parts):
        return
    reassigner = Reassigner(args.admin_used, root)
    try:
        if "move" in args.parts:
            topic = run_moves(cluster, args, reassigner, events)
        else:
            topic = f"events-{time.monotonic_ns()}"
            cluster.create_topic(topic, 1)
            fill(cluster.bootstrap(), topic, max(args.sizes_mib))
        if "shutdown" in args.parts:
            run_shutdowns(cluster, args, topic, events)
        if "failover" in args.parts:
            run_failover(cluster, reassigner, topic, events, args.wal)
    finally:
        reassigner.close()


if __name__ == "__main__":
    main()
