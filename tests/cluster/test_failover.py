"""Brokers of a cluster dying, freezing and coming back, under load: nothing acknowledged is
lost or doubled, and a fenced broker acknowledges nothing more.

The brokers keep their WAL in a file here: a dead broker's unuploaded records are on its disk
only, so its partitions stay unavailable until it returns (never served with acknowledged data
missing); a frozen one resumes and hands them over itself.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewTopic
from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse

from protocol.errors import ErrorCode
from tests.automq_py.test_idempotence import init_producer_id, produce
from tests.cluster.conftest import SESSION_MS, Cluster, ClusterFactory
from tests.support.postgres import PostgresServer
from tests.support.raw_connection import RawConnection
from tests.support.seaweedfs import SeaweedFS


class _Lines(logging.Handler):
    """A client's log lines, kept."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.logger = logging.getLogger(f"rdkafka-{id(self)}")
        self.logger.propagate = False
        self.logger.setLevel(logging.DEBUG)
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(time.strftime("%H:%M:%S ") + record.getMessage())


class Load:
    """An idempotent acks=all producer writing numbered records to every partition of its
    topics until stopped; what it was acknowledged, per record."""

    running: list[Load] = []  # stopped after each test, whatever became of it

    def __init__(self, bootstrap: str, *topics: str) -> None:
        self.topics = topics  # written in turn
        self.acked: list[bytes] = []
        # value -> (partition, offset, wall-clock time) it was acknowledged at: where a record
        # reported lost should be
        self.acked_at: dict[bytes, tuple[int, int, float]] = {}
        # (topic, partition) -> when it last acknowledged a record
        self.last_ack: dict[tuple[str, int], float] = {}
        self.errors: list[str] = []
        # librdkafka's idempotence log (PID, epoch bumps and why): a record stored twice
        # with an epoch bump between its copies was sent again by the client as new
        self.eos_log = _Lines()
        self._stop = threading.Event()
        self._flush_s = 120.0
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
                "debug": "eos",
            },
            logger=self.eos_log.logger,
        )
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err, msg) -> None:  # type: ignore[no-untyped-def]
        if err is None:
            self.acked.append(msg.value())
            self.acked_at[msg.value()] = (msg.partition(), msg.offset(), time.time())
            self.last_ack[(msg.topic(), msg.partition())] = time.monotonic()
        else:
            self.errors.append(str(err))

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                topic = self.topics[i % len(self.topics)]
                self._producer.produce(
                    topic, value=f"{topic}:{i}".encode(), on_delivery=self._delivered
                )
                i += 1
            except BufferError:
                pass
            self._producer.poll(0.002)
        self._producer.flush(self._flush_s)

    def start(self) -> Load:
        self._thread.start()
        Load.running.append(self)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self._flush_s + 30)


class GroupReader:
    """A consumer group member reading topics and committing synchronously as it goes; what it
    read when, and the latest offset each commit was acknowledged for."""

    running: list[GroupReader] = []

    def __init__(self, bootstrap: str, group: str, *topics: str) -> None:
        self.group = group
        self.read_at: dict[tuple[str, int], float] = {}  # when it last read from a partition
        self.committed: dict[tuple[str, int], int] = {}
        self.commit_errors: list[str] = []
        self._stop = threading.Event()
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        self._consumer.subscribe(list(topics))
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last_commit = time.monotonic()
        while not self._stop.is_set():
            msg = self._consumer.poll(0.1)
            if msg is not None and not msg.error():
                self.read_at[(msg.topic(), msg.partition())] = time.monotonic()
            if time.monotonic() - last_commit < 0.3:
                continue
            last_commit = time.monotonic()
            try:
                done = self._consumer.commit(asynchronous=False) or []
            except KafkaException as e:  # nothing read since, or the coordinator moving
                if e.args[0].code() != KafkaError._NO_OFFSET:
                    self.commit_errors.append(str(e))
                continue
            for tp in done:
                if tp.error is None and tp.offset >= 0:
                    self.committed[(tp.topic, tp.partition)] = tp.offset
        self._consumer.close()

    def start(self) -> GroupReader:
        self._thread.start()
        GroupReader.running.append(self)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


@pytest.fixture(autouse=True)
def _stop_loads() -> Iterator[None]:
    yield
    while Load.running:
        load = Load.running.pop()
        load._flush_s = 1.0  # a test that failed may have left it nothing to flush to
        load.stop()
    while GroupReader.running:
        GroupReader.running.pop().stop()


# what a partition answers while it moves between brokers
_MOVING = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError._TIMED_OUT,
}


# what the last _read_all found, by (topic, partition): (offset, value) in offset order, shown
# when records are missing
_LAYOUT: dict[tuple[str, int], list[tuple[int, bytes]]] = {}


def _read_all(cluster: Cluster, topic: str, partitions: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"check-{time.monotonic_ns()}",
            "auto.offset.reset": "error",  # a skip would read as records lost
        }
    )
    admin = cluster.admin(0)
    md = admin.list_topics(topic, timeout=10)
    assert len(md.topics[topic].partitions) == partitions
    ends = {}
    for p in range(partitions):
        deadline = time.monotonic() + 30
        while True:  # a partition may be moving (a returning broker's rebalance): retried
            try:
                _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                break
            except KafkaException as e:
                if e.args[0].code() not in _MOVING or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        ends[p] = high
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    # by offset: what the log holds (a consumer may deliver an offset again after its
    # partition moved; a record stored twice is at two offsets)
    got: dict[tuple[int, int], bytes] = {}
    seen = Counter[int]()
    deadline = time.monotonic() + 90
    try:
        while any(seen[p] < ends[p] for p in ends) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() != KafkaError._AUTO_OFFSET_RESET, msg.error()
                continue
            got[(msg.partition(), msg.offset())] = msg.value()
            seen[msg.partition()] = max(seen[msg.partition()], msg.offset() + 1)
    finally:
        consumer.close()
    for (p, offset), value in sorted(got.items()):
        _LAYOUT.setdefault((topic, p), []).append((offset, value))
    return list(got.values())


def _create(cluster: Cluster, topic: str, partitions: int, via: int = 0) -> None:
    admin = cluster.admin(via)  # held until the result: a dropped client cancels its requests
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(timeout=30)


_BUMP_WORDS = ("bump", "epoch:", "out of order", "fatal")


def _refused_appends(cluster: Cluster) -> list[str]:
    """The appends the brokers refused for their producer state (out-of-order sequences,
    fenced epochs), as each logged them."""
    found = []
    for node_id, broker in enumerate(cluster.brokers):
        try:
            text = broker.log_path.read_text(errors="replace")
        except OSError:
            continue
        found += [f"{node_id}: {line}" for line in text.splitlines() if " refused: " in line]
    return found


def _exactly_once(load: Load, stored: list[bytes], cluster: Cluster) -> None:
    counts = Counter(stored)
    doubled = [v for v, n in counts.items() if n > 1]
    lost = [v for v in load.acked if v not in counts]
    layout = {
        tp: f"{len(held)} records, offsets {held[0][0]}..{held[-1][0]}, first {held[:3]}"
        for tp, held in _LAYOUT.items()
        if held
    }
    # each lost record: where it was acknowledged, when, and what that offset holds now
    held_at = {(tp, offset): v for tp, held in _LAYOUT.items() for offset, v in held}
    _LAYOUT.clear()
    where = []
    for v in lost[:5]:
        p, offset, at = load.acked_at[v]
        topic = v.split(b":")[0].decode()
        stamp = time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at % 1 * 1000):03d}"
        now = held_at.get(((topic, p), offset))
        where.append(f"{v!r} at {topic}-{p}@{offset} {stamp}, now {now!r}")
    assert not lost, f"{len(lost)} acknowledged records lost: {'; '.join(where)}; read {layout}"
    copies = {  # where each copy is, and where the client was told it is
        v: ([f"{t}-{p}@{o}" for ((t, p), o), w in held_at.items() if w == v], load.acked_at.get(v))
        for v in doubled[:5]
    }
    bumps = [line for line in load.eos_log.lines if any(w in line.lower() for w in _BUMP_WORDS)]
    refusals = _refused_appends(cluster)[:10] if doubled else []
    assert not doubled, (
        f"{len(doubled)} records stored twice, e.g. {copies}; client: {bumps[:20]}; "
        f"brokers: {refusals}"
    )


def test_the_controller_dies_and_another_takes_over(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(brokers=3)
    _create(cluster, "before", 3)
    controller = cluster.controller()
    victim = cluster.brokers[controller]
    victim.kill()
    survivor = next(i for i, b in enumerate(cluster.brokers) if b.pid is not None)
    deadline = time.monotonic() + SESSION_MS / 1000 + 5
    while cluster.controller() == controller:  # until the survivors agree on one of them
        assert time.monotonic() < deadline, "no controller took over"
        time.sleep(0.2)
    _create(cluster, "after", 3, via=survivor)  # topic creation works again
    cluster.wait_for_brokers(2, via=survivor)
    victim.start()  # it returns, and leaves cleanly at the end
    cluster.wait_for_brokers(3, via=survivor)


def test_a_frozen_broker_is_fenced_and_loses_nothing(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(brokers=3)
    _create(cluster, "frozen", 6)
    load = Load(cluster.bootstrap, "frozen").start()
    time.sleep(2)
    victim = cluster.brokers[2]
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        time.sleep(SESSION_MS / 1000 + 3)  # past its session: fenced, partitions moved
        cluster.wait_for_brokers(2, via=0)
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    time.sleep(5)  # it hands over what it held and registers again
    load.stop()
    cluster.wait_for_brokers(3, via=0)
    assert len(load.acked) > 1000
    assert not load.errors, load.errors[:5]
    _exactly_once(load, _read_all(cluster, "frozen", 6), cluster)
    log = victim.log_path.read_text()
    assert "was fenced by the controller" in log


def _described_brokers(cluster: Cluster, *, include_fenced: bool) -> list[tuple[int, bool]]:
    with RawConnection(cluster.brokers[0].bootstrap) as conn:
        answer = conn.call(
            DescribeClusterRequest[2](
                include_cluster_authorized_operations=False,
                endpoint_type=1,
                include_fenced_brokers=include_fenced,
            ),
            DescribeClusterResponse,
        )
    return [(b.broker_id, b.is_fenced) for b in answer.brokers]


def test_a_killed_broker_on_the_file_wal_loses_nothing(cluster_factory: ClusterFactory) -> None:
    """kill -9: its unuploaded records are in its WAL file only, so its partitions are not
    served elsewhere until it returns (others wait for it to hand them over); the other
    partitions take writes all along; once it is back, every acknowledged record is there
    exactly once."""
    cluster = cluster_factory(brokers=3)
    _create(cluster, "killed", 6)
    load = Load(cluster.bootstrap, "killed").start()
    time.sleep(2)
    victim = cluster.brokers[2]
    victim.kill()
    time.sleep(SESSION_MS / 1000 + 1)  # fenced, its partitions given to others
    # DescribeCluster v2 (KIP-1073) lists it, fenced, when asked to; else only the live ones
    assert _described_brokers(cluster, include_fenced=True) == [(0, False), (1, False), (2, True)]
    assert _described_brokers(cluster, include_fenced=False) == [(0, False), (1, False)]
    acked = len(load.acked)
    time.sleep(3)
    assert len(load.acked) > acked  # the survivors' partitions take writes meanwhile
    victim.start()  # recovers its WAL, closes its streams: the new leaders open them
    time.sleep(5)
    load.stop()
    cluster.wait_for_brokers(3, via=0)
    assert not load.errors, load.errors[:5]
    _exactly_once(load, _read_all(cluster, "killed", 6), cluster)


@pytest.mark.parametrize("victim_role", ["broker", "controller"])
def test_a_killed_broker_on_the_object_wal_fails_over_within_its_session(
    cluster_factory: ClusterFactory, s3_server: SeaweedFS, victim_role: str
) -> None:
    """kill -9 with the WAL in object storage, under idempotent acks=all load on 3 topics of 6
    partitions and a consumer group reading them: once the controller (a new one, when the
    controller was killed) has fenced the broker it recovers its WAL objects (uploads them,
    closes its streams) and the partitions serve again on the others, every one within the
    session timeout and 3 s; nothing acknowledged is lost or doubled, and the group reads on
    (its coordinator moved too, when the victim held it) with no committed offset lost."""
    cluster = cluster_factory(brokers=3, **{"s3.wal.path": f"0@{s3_server.url()}"})
    topics = ["diskless-a", "diskless-b", "diskless-c"]
    for topic in topics:
        _create(cluster, topic, 6)
    controller = cluster.controller()
    load = Load(cluster.bootstrap, *topics).start()
    reader = GroupReader(cluster.bootstrap, "readers", *topics).start()
    deadline = time.monotonic() + 30
    while len(reader.committed) < 18:  # the group reads and has committed for every partition
        assert time.monotonic() < deadline, f"group committed for {len(reader.committed)}"
        time.sleep(0.2)
    victim_id = (
        controller if victim_role == "controller" else next(n for n in range(3) if n != controller)
    )
    victim = cluster.brokers[victim_id]
    victim.kill()
    killed = time.monotonic()
    committed_before = dict(reader.committed)
    deadline = killed + SESSION_MS / 1000 + 3
    while time.monotonic() < deadline + 5:
        if len(load.last_ack) == 18 and min(load.last_ack.values()) > killed:
            break
        time.sleep(0.1)
    serving = max(load.last_ack.values()) if len(load.last_ack) == 18 else float("inf")
    stale = sorted(tp for tp, t in load.last_ack.items() if t <= killed)
    assert not stale and serving <= deadline, (stale, serving - killed)
    print(f"every partition took writes again {serving - killed:.1f} s after the kill")
    survivor = next(n for n in range(3) if n != victim_id)
    _create(cluster, "afterwards", 3, via=survivor)  # a controller acts (a new one, if need be)
    victim.start()  # its WAL was recovered for it: it joins again and leaves cleanly at the end
    cluster.wait_for_brokers(3, via=survivor)
    resumed = time.monotonic()
    deadline = resumed + 30
    while any(reader.read_at.get((t, p), 0) < resumed for t in topics for p in range(6)):
        assert time.monotonic() < deadline, "the group stopped reading some partitions"
        time.sleep(0.2)
    load.stop()
    reader.stop()
    assert not load.errors, load.errors[:5]
    stored = [v for topic in topics for v in _read_all(cluster, topic, 6)]
    _exactly_once(load, stored, cluster)
    # what the group had committed is still committed, and its later commits too
    check = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": reader.group})
    try:
        now = check.committed([TopicPartition(t, p) for t in topics for p in range(6)], timeout=30)
    finally:
        check.close()
    held = {(tp.topic, tp.partition): tp.offset for tp in now}
    assert all(held[tp] >= offset for tp, offset in committed_before.items()), held
    assert all(held[tp] >= offset for tp, offset in reader.committed.items()), held
    logs = "".join(b.log_path.read_text() for b in cluster.brokers)
    assert f"recovered node {victim_id}'s WAL" in logs


def test_postgresql_away_for_a_while(tmp_path: Path, s3_server: SeaweedFS) -> None:
    """The metadata's database stopped for 13 s (over two sessions) under load, then
    started again: no broker exits, producers wait (acknowledgements are held while a broker
    cannot renew its session), and nothing acknowledged is lost or doubled."""
    with PostgresServer() as database:
        cluster = Cluster(tmp_path, s3_server, database.create_database())
        try:
            cluster.add_many(3)
            cluster.wait_for_brokers(3)
            _create(cluster, "outage", 6)
            load = Load(cluster.bootstrap, "outage").start()
            time.sleep(2)
            database.pause()
            time.sleep(2 * SESSION_MS / 1000 + 1)
            assert all(b.running for b in cluster.brokers)
            database.resume()
            time.sleep(6)  # sessions renew, held acknowledgements go out
            load.stop()
            assert len(load.acked) > 1000
            assert not load.errors, load.errors[:5]
            _exactly_once(load, _read_all(cluster, "outage", 6), cluster)
            cluster.wait_for_brokers(3)
        finally:
            codes = cluster.stop()
        assert codes == [0, 0, 0], "\n\n".join(b.log_tail() for b in cluster.brokers)


def test_a_batch_written_before_a_kill_is_a_duplicate_at_the_next_leader(
    cluster_factory: ClusterFactory,
) -> None:
    """An idempotent batch the killed leader wrote to its WAL but (as far as the client
    knows) never acknowledged, sent again to the partition's next leader, is answered with
    its original offset and not appended again."""
    cluster = cluster_factory(brokers=2)
    _create(cluster, "retried", 1)
    leader = cluster.leaders("retried")[0]
    victim = cluster.brokers[leader]
    conn = RawConnection(victim.bootstrap)
    try:
        pid = init_producer_id(conn).producer_id
        for seq in range(0, 30, 3):
            assert produce(conn, "retried", pid, 0, seq) == (ErrorCode.NONE, seq)
    finally:
        conn.close()
    victim.kill()
    time.sleep(SESSION_MS / 1000 + 1)
    victim.start()  # recovers its WAL and closes its streams: the other broker opens them
    deadline = time.monotonic() + 30
    answers = []
    while time.monotonic() < deadline:  # to whichever broker leads it by then
        conn = RawConnection(cluster.brokers[len(answers) % 2].bootstrap)
        try:
            answers.append(produce(conn, "retried", pid, 0, 27))
        finally:
            conn.close()
        if answers[-1][0] == ErrorCode.NONE:
            break
        time.sleep(0.25)
    assert answers[-1] == (ErrorCode.NONE, 27), answers
    assert len(_read_all(cluster, "retried", 1)) == 30


def test_a_frozen_broker_whose_object_wal_was_recovered_restarts_and_loses_nothing(
    cluster_factory: ClusterFactory, s3_server: SeaweedFS
) -> None:
    """Frozen past its session with the WAL in object storage: the controller recovers the
    WAL on its behalf, and the recovery's epoch record fences every WAL object the frozen
    process writes from then on. Resumed, the broker must not register again with that WAL
    (what it acknowledged next would be lost with its next crash): it takes no more appends
    and asks to be restarted. Restarted, it rejoins; nothing acknowledged is lost or doubled."""
    cluster = cluster_factory(brokers=3, **{"s3.wal.path": f"0@{s3_server.url()}"})
    _create(cluster, "frozen-diskless", 6)
    load = Load(cluster.bootstrap, "frozen-diskless").start()
    time.sleep(2)
    controller = cluster.controller()
    victim_id = next(n for n in range(3) if n != controller)
    victim = cluster.brokers[victim_id]
    assert victim.pid is not None
    others = [b for b in cluster.brokers if b is not victim]
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + SESSION_MS / 1000 + 20
        recovered = f"recovered node {victim_id}'s WAL"
        while not any(recovered in b.log_path.read_text() for b in others):
            assert time.monotonic() < deadline, "the controller never recovered the WAL"
            time.sleep(0.2)
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    deadline = time.monotonic() + 20
    while "restart the broker to rejoin" not in victim.log_path.read_text():
        assert time.monotonic() < deadline, victim.log_tail()
        time.sleep(0.2)
    assert "registered again" not in victim.log_path.read_text()
    victim.kill()
    victim.start()
    cluster.wait_for_brokers(3, via=controller)
    time.sleep(3)
    load.stop()
    assert len(load.acked) > 1000
    assert not load.errors, load.errors[:5]
    _exactly_once(load, _read_all(cluster, "frozen-diskless", 6), cluster)
