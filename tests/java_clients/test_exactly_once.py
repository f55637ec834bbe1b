"""Exactly-once with Apache Kafka's own Java clients against the real broker process, across a
SIGKILL of the client: a transactional consume-transform-produce loop
(``tests/java/.../TransformLoop.java``) and a Kafka Streams word count with
``processing.guarantee=exactly_once_v2`` (``WordCountStreams.java``), each on the Kafka 4.4 and
the Kafka 3.9 clients. The output is read back by confluent-kafka with ``read_committed``.
"""

from __future__ import annotations

import random
import struct
import threading
import time
import uuid
from collections import Counter, defaultdict
from itertools import pairwise
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic

from tests.automq_py.conftest import MakeBroker
from tests.support.java import JavaProgram, java_command

pytestmark = pytest.mark.integration

PARTITIONS = 3
KAFKA = pytest.mark.parametrize("kafka", ["4.4", "3.9"])
# groups start at once, not after the default 3 s wait for more members
FAST_GROUPS = {"group.initial.rebalance.delay.ms": "0"}


def create_topics(bootstrap: str, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, PARTITIONS, 1) for n in names]).values():
        future.result(15)


class KeyedProducer:
    """confluent-kafka with acks=all and idempotence, so each key's records land in the order
    sent; ``flush`` fails if any record was not delivered."""

    def __init__(self, bootstrap: str) -> None:
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True}
        )
        self._failed: list[KafkaError] = []

    def send(self, topic: str, key: str, value: str) -> None:
        self._producer.produce(topic, value.encode(), key.encode(), on_delivery=self._delivered)
        self._producer.poll(0)

    def _delivered(self, error: KafkaError | None, _message: object) -> None:
        if error is not None:
            self._failed.append(error)

    def flush(self) -> None:
        assert self._producer.flush(30) == 0
        assert not self._failed, self._failed


def read_records(
    bootstrap: str,
    topic: str,
    expected: int = 0,
    timeout: float = 60,
    isolation: str = "read_committed",
) -> list[tuple[bytes, bytes]]:
    """Every committed record of ``topic`` as (key, value), each partition in order (with
    ``isolation="read_uncommitted"``, open transactions' records too); reads until ``expected``
    came and every partition's end is reached, so more than ``expected`` shows."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got: list[tuple[bytes, bytes]] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and (len(got) < expected or len(at_end) < PARTITIONS):
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            error, partition = msg.error(), msg.partition()
            assert partition is not None
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                at_end.add(partition)
                continue
            at_end.discard(partition)
            key, value = msg.key(), msg.value()
            assert key is not None and value is not None
            got.append((key, value))
    finally:
        consumer.close()
    return got


def by_key(records: list[tuple[bytes, bytes]]) -> dict[bytes, list[bytes]]:
    out: dict[bytes, list[bytes]] = defaultdict(list)
    for key, value in records:
        out[key].append(value)
    return dict(out)


# --- the transactional consume-transform-produce loop -------------------------------------------

LOOP = "io.automq.tests.TransformLoop"
RECORDS = 20_000
KEYS = 50


@KAFKA
def test_transform_loop_is_exactly_once_across_a_kill(
    make_broker: MakeBroker, tmp_path: Path, kafka: str
) -> None:
    """A loop killed by SIGKILL between transactions (or inside one) and restarted with the same
    transactional.id and group leaves every input record in the output exactly once, each key's
    records in their input order: the successor fences the dead producer and aborts its open
    transaction, and resumes from the offsets the last committed transaction stored."""
    broker = make_broker(**FAST_GROUPS)
    source, sink = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    create_topics(broker.bootstrap, source, sink)
    records = [(f"key-{i % KEYS}", f"value-{i}") for i in range(RECORDS)]
    producer = KeyedProducer(broker.bootstrap)
    for key, value in records:
        producer.send(source, key, value)
    producer.flush()
    args = (broker.bootstrap, source, sink, f"group-{uuid.uuid4()}", f"tx-{uuid.uuid4()}")

    first = JavaProgram(java_command(LOOP, *args, kafka=kafka), tmp_path / "loop-1.log")
    with first:
        first.wait_for(lambda line: committed_count(line) >= RECORDS // 5, timeout=90)
        first.kill()
    before_kill = max(committed_count(line) for line in first.lines)
    assert before_kill < RECORDS, "the kill must land mid-stream"

    second = JavaProgram(
        java_command(LOOP, *args, "--exit-when-caught-up", kafka=kafka), tmp_path / "loop-2.log"
    )
    with second:
        caught_up = second.wait_for(lambda line: line.startswith("caught-up "), timeout=120)
        assert second.wait(timeout=30) == 0, second.log_tail()
    # the successor started from the committed offsets, not from the beginning
    assert 0 < int(caught_up.split()[1]) <= RECORDS - before_kill

    expected = by_key([(k.encode(), v.upper().encode()) for k, v in records])
    assert by_key(read_records(broker.bootstrap, sink, RECORDS)) == expected


def committed_count(line: str) -> int:
    return int(line.split()[1]) if line.startswith("committed ") else 0


# --- Kafka Streams' word count with exactly_once_v2 ---------------------------------------------

STREAMS = "io.automq.tests.WordCountStreams"
WORDS = [f"w{i:02d}" for i in range(40)]


class LineFeeder:
    """Writes lines of six words to ``topic`` from a background thread, 50 every 50 ms, until
    the ``with`` block ends (then flushed): the application gets its input as a stream, so a
    kill lands while input is still arriving. ``lines`` holds what was written."""

    def __init__(self, bootstrap: str, topic: str, seed: int) -> None:
        self.topic, self.seed = topic, seed
        self.lines: list[tuple[str, str]] = []
        self._producer = KeyedProducer(bootstrap)
        self._words = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for _ in range(50):
                key = f"{self.seed}-{len(self.lines)}"
                line = " ".join(self._words.choices(WORDS, k=6))
                self._producer.send(self.topic, key, line)
                self.lines.append((key, line))
            self._stop.wait(0.05)

    def __enter__(self) -> LineFeeder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._producer.flush()


def word_counts(lines: list[tuple[str, str]]) -> dict[str, int]:
    return dict(Counter(word for _, line in lines for word in line.split()))


def counts_by_word(records: list[tuple[bytes, bytes]]) -> dict[str, list[int]]:
    """Each word's counts in the order the output topic holds them (values are 8-byte longs)."""
    return {
        key.decode(): [struct.unpack(">q", v)[0] for v in values]
        for key, values in by_key(records).items()
    }


def wait_for_counts(bootstrap: str, topic: str, truth: dict[str, int], timeout: float) -> None:
    """Until the last committed count of every word is its true count."""
    deadline = time.monotonic() + timeout
    last: dict[str, int] = {}
    while time.monotonic() < deadline:
        got = counts_by_word(read_records(bootstrap, topic, timeout=10))
        last = {word: counts[-1] for word, counts in got.items()}
        if last == truth:
            return
        time.sleep(0.5)
    raise AssertionError(f"counts not reached within {timeout}s: {last} != {truth}")


def wait_for_new_counts(
    bootstrap: str, topic: str, above: dict[str, int], timeout: float = 60
) -> None:
    """Until some word's count passes ``above`` in what the output holds, open transactions'
    records included: the application is writing."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"watch-{uuid.uuid4()}",
            "isolation.level": "read_uncommitted",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.1)
            if msg is None or msg.error() is not None:
                continue
            key, value = msg.key(), msg.value()
            assert key is not None and value is not None
            if struct.unpack(">q", value)[0] > above.get(key.decode(), 0):
                return
    finally:
        consumer.close()
    raise AssertionError(f"no count above {above} within {timeout}s")


def assert_killed_mid_stream(bootstrap: str, topic: str, truth: dict[str, int]) -> None:
    """Even with the records of its open transactions, a killed application had not yet
    written every word's true count."""
    written = counts_by_word(read_records(bootstrap, topic, isolation="read_uncommitted"))
    assert {word: counts[-1] for word, counts in written.items()} != truth, "not mid-stream"


def topic_overrides(bootstrap: str, topic: str) -> dict[str, str]:
    """The configs set on ``topic`` itself (not the broker's defaults)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    return {
        name: entry.value
        for name, entry in future.result(15).items()
        if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    }


def partition_count(bootstrap: str, topic: str) -> int:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=15)
    return len(metadata.topics[topic].partitions)


def low_watermarks(bootstrap: str, topic: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4()}"})
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return [consumer.get_watermark_offsets(tp, 10)[0] for tp in partitions]
    finally:
        consumer.close()


@KAFKA
def test_word_count_streams_is_exactly_once_across_kills(
    make_broker: MakeBroker, tmp_path: Path, kafka: str
) -> None:
    """Kafka Streams with exactly_once_v2, SIGKILLed while it counts and restarted on its state
    directory, SIGKILLed again and replaced by an instance with an empty state directory (its
    store restored from the changelog topic, the dead instance's transactions aborted by the
    broker when they time out), writes every word's true count, each word's counts strictly
    increasing: no record is lost or counted twice through the repartition topic, the store or
    the output. Its internal topics exist with the configs Streams asked for."""
    # the dead instance's transactions (Streams' transaction.timeout.ms is 10 s) are aborted
    # within a second of timing out
    broker = make_broker(
        **FAST_GROUPS, **{"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}
    )
    app = f"wc-{uuid.uuid4().hex[:8]}"
    source, sink = f"{app}-lines", f"{app}-counts"
    create_topics(broker.bootstrap, source, sink)

    def streams(state_dir: str, log: str) -> JavaProgram:
        state = str(tmp_path / state_dir)
        command = java_command(STREAMS, broker.bootstrap, app, source, sink, state, kafka=kafka)
        return JavaProgram(command, tmp_path / log)

    def running(line: str) -> bool:
        assert not line.endswith("ERROR"), f"Kafka Streams failed ({line}): see {tmp_path}"
        return line.endswith("->RUNNING")

    with streams("state", "streams-1.log") as first:
        first.wait_for(running, timeout=60)
        with LineFeeder(broker.bootstrap, source, seed=1) as feeder:
            wait_for_new_counts(broker.bootstrap, sink, {})
            first.kill()
    first_lines = feeder.lines
    truth = word_counts(first_lines)
    assert_killed_mid_stream(broker.bootstrap, sink, truth)

    with streams("state", "streams-2.log") as second:
        second.wait_for(running, timeout=60)
        wait_for_counts(broker.bootstrap, sink, truth, timeout=60)
        with LineFeeder(broker.bootstrap, source, seed=2) as feeder:
            wait_for_new_counts(broker.bootstrap, sink, truth)
            second.kill()
    truth = word_counts(first_lines + feeder.lines)
    assert_killed_mid_stream(broker.bootstrap, sink, truth)

    with streams("fresh-state", "streams-3.log") as third:
        third.wait_for(running, timeout=60)
        wait_for_counts(broker.bootstrap, sink, truth, timeout=90)

    counts = counts_by_word(read_records(broker.bootstrap, sink))
    assert {word: c[-1] for word, c in counts.items()} == truth
    for word, c in counts.items():
        assert all(a < b for a, b in pairwise(c)), f"{word}: {c}"

    # the internal topics as Streams created them: as many partitions as the input, its configs
    repartition, changelog = f"{app}-words-repartition", f"{app}-counts-changelog"
    assert topic_overrides(broker.bootstrap, repartition) == {
        "cleanup.policy": "delete",
        "retention.ms": "-1",
        "segment.bytes": "52428800",
        "message.timestamp.type": "CreateTime",
    }
    assert topic_overrides(broker.bootstrap, changelog) == {
        "cleanup.policy": "compact",
        "message.timestamp.type": "CreateTime",
    }
    assert partition_count(broker.bootstrap, repartition) == PARTITIONS
    assert partition_count(broker.bootstrap, changelog) == PARTITIONS
    # Streams deleted (DeleteRecords) what it had consumed of the repartition topic
    assert all(low > 0 for low in low_watermarks(broker.bootstrap, repartition))
