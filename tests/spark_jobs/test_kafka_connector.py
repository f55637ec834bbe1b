"""Spark's Kafka connector (``spark-sql-kafka-0-10``, as users run it) against the real broker
process: batch reads with offset ranges and headers, ``availableNow`` and micro-batch streaming
queries restarted from their checkpoints, and the Kafka sink in batch and streaming, checked
with confluent-kafka on the other side."""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import py4j.java_gateway  # type: ignore[import-untyped]
import py4j.protocol  # type: ignore[import-untyped]
import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from tests.support.broker import BrokerProcess
from tests.support.java import spark_kafka_jars
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

# Kafka's TimestampType ids, as Spark's timestampType column gives them
CREATE_TIME, LOG_APPEND_TIME = 0, 1

Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(slots=True, frozen=True, order=True)
class Record:
    """One Kafka record, ordered by its position."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int  # epoch milliseconds
    timestamp_type: int
    headers: Headers


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    """One broker for the module (each test makes topics of its own): a broker per test would
    cost more than most of these tests take."""
    started = BrokerProcess(
        tmp_path_factory.mktemp("kafka-connector") / "broker",
        {"s3.data.buckets": s3_server.url(), "cluster.id": f"t{time.monotonic_ns()}"},
    )
    started.start()
    yield started
    code = started.stop()
    assert code == 0, started.log_tail()


@pytest.fixture(scope="module")
def spark(
    tmp_path_factory: pytest.TempPathFactory, broker: BrokerProcess
) -> Iterator[SparkSession]:
    """One local[2] session for the module, in a JVM of its own that has the connector's jars
    pyspark lacks. It stops before the broker does, and its JVM with it: the Kafka sink's
    producers live in a cache of the JVM's, not the session's, and would keep reconnecting to
    the stopped broker."""
    scratch = tmp_path_factory.mktemp("spark")
    reset_pyspark()
    with pytest.MonkeyPatch.context() as mp:
        # The JVM inherits these at launch: Spark otherwise binds the machine's public address
        # and starts its Python workers with the system python.
        mp.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        mp.setenv("PYSPARK_PYTHON", sys.executable)
        # no hsperfdata directory left in /tmp by the launcher's JVM nor the driver's
        mp.setenv("SPARK_LAUNCHER_OPTS", "-XX:-UsePerfData")
        session = (
            SparkSession.builder.master("local[2]")
            .appName("automq-py-kafka-connector")
            .config("spark.jars", ",".join(str(jar) for jar in spark_kafka_jars()))
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.local.dir", str(scratch))
            .config(
                "spark.driver.extraJavaOptions",
                f"-Djava.io.tmpdir={scratch} -XX:-UsePerfData",
            )
            .getOrCreate()
        )
    session.sparkContext.setLogLevel("WARN")
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()
        reset_pyspark()


def reset_pyspark() -> None:
    """Leave this process's pyspark as if it had not run: the JVM an earlier module launched
    stopped, so that the next session launches one with its own ``spark.jars`` (jars given to a
    later session in a running JVM never reach the driver's class loader: "Failed to find data
    source: kafka"); and py4j's error handler as py4j made it, not as a SparkSession patched it
    (it turns a failed Python task into pyspark's PythonException, whose message SparkContext
    users such as ``spark_jobs.runner`` do not parse)."""
    gateway = SparkContext._gateway
    if gateway is not None:
        assert SparkContext._active_spark_context is None, "a SparkContext runs in this process"
        gateway.shutdown()
        # pyspark's JVM exits when its stdin closes (so that it never outlives the Python driver)
        gateway.proc.stdin.close()
        gateway.proc.wait(60)
        SparkContext._gateway = None
        SparkContext._jvm = None
    py4j.java_gateway.get_return_value = py4j.protocol.get_return_value


def create_topic(broker: BrokerProcess, partitions: int) -> str:
    topic = f"spark-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)
    return topic


def kafka_options(broker: BrokerProcess, topic: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic}


def produce(broker: BrokerProcess, topic: str, count: int, partitions: int) -> list[Record]:
    """``count`` records round-robin over the partitions with confluent-kafka, each with a
    CreateTime of its own and headers (one empty, one null), some with a null key; the records
    the partitions then hold, by position."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    base_ts = 1_700_000_000_000
    next_offset = [0] * partitions
    records = []
    for i in range(count):
        partition = i % partitions
        record = Record(
            topic,
            partition,
            next_offset[partition],
            key=None if i % 7 == 0 else f"key-{i}".encode(),
            value=f"value-{i}".encode(),
            timestamp=base_ts + i,
            timestamp_type=CREATE_TIME,
            headers=(("index", str(i).encode()), ("empty", b""), ("null", None)),
        )
        producer.produce(
            topic,
            record.value,
            record.key,
            partition=partition,
            timestamp=record.timestamp,
            headers=list(record.headers),
        )
        records.append(record)
        next_offset[partition] += 1
    assert producer.flush(30) == 0
    return sorted(records)


def source_records(df: DataFrame) -> list[Record]:
    """The rows of Spark's Kafka source (read with includeHeaders) as Records, by position."""
    selected = df.selectExpr(
        "topic",
        "partition",
        "offset",
        "key",
        "value",
        "unix_millis(timestamp)",
        "timestampType",
        "headers",
    )
    return sorted(
        Record(
            r[0],
            r[1],
            r[2],
            key=None if r[3] is None else bytes(r[3]),
            value=None if r[4] is None else bytes(r[4]),
            timestamp=r[5],
            timestamp_type=r[6],
            headers=tuple((h.key, None if h.value is None else bytes(h.value)) for h in r[7]),
        )
        for r in selected.collect()
    )


def consume_all(broker: BrokerProcess, topic: str, partitions: int, expected: int) -> list[Record]:
    """Every record of ``topic`` as confluent-kafka reads it, by position, after checking that
    the partitions hold exactly ``expected`` records."""
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        held = sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        )
        assert held == expected, f"{topic} holds {held} records, not {expected}"
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        records: list[Record] = []
        deadline = time.monotonic() + 30
        while len(records) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                records.append(as_record(msg))
    finally:
        consumer.close()
    assert len(records) == expected, f"read {len(records)} of {expected} records"
    return sorted(records)


def as_record(msg: Message) -> Record:
    kind, timestamp = msg.timestamp()
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return Record(
        topic,
        partition,
        offset,
        key=msg.key(),
        value=msg.value(),
        timestamp=timestamp,
        timestamp_type=CREATE_TIME if kind == TIMESTAMP_CREATE_TIME else LOG_APPEND_TIME,
        headers=tuple(msg.headers() or ()),  # type: ignore[arg-type]
    )


def test_batch_read_gives_every_field_of_what_another_client_produced(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    """A batch read from earliest to latest gives each record confluent-kafka produced once,
    with its key (null included), value, topic, partition, offset, CreateTime and headers (empty
    and null values included)."""
    topic = create_topic(broker, partitions=3)
    expected = produce(broker, topic, 60, partitions=3)

    df = (
        spark.read.format("kafka")
        .options(**kafka_options(broker, topic))
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("includeHeaders", "true")
        .load()
    )

    assert source_records(df) == expected


def test_batch_read_of_an_offset_range_per_partition(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    """startingOffsets/endingOffsets given per partition as JSON (-2 earliest, -1 latest) select
    exactly those offsets, the end exclusive."""
    topic = create_topic(broker, partitions=3)
    expected = produce(broker, topic, 60, partitions=3)  # 20 records per partition
    starting = {topic: {"0": 5, "1": -2, "2": 19}}
    ending = {topic: {"0": 12, "1": 3, "2": -1}}

    df = (
        spark.read.format("kafka")
        .options(**kafka_options(broker, topic))
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .option("includeHeaders", "true")
        .load()
    )

    wanted = {0: range(5, 12), 1: range(0, 3), 2: range(19, 20)}
    assert source_records(df) == [r for r in expected if r.offset in wanted[r.partition]]


def test_available_now_reads_everything_present_and_stops(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    """A streaming query with trigger(availableNow=True) reads every record present when it
    starts, in several micro-batches when maxOffsetsPerTrigger caps them, and then stops on its
    own."""
    topic = create_topic(broker, partitions=2)
    expected = produce(broker, topic, 30, partitions=2)
    name = f"available_now_{uuid.uuid4().hex[:8]}"

    query = (
        spark.readStream.format("kafka")
        .options(**kafka_options(broker, topic))
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .option("maxOffsetsPerTrigger", "10")
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(60), "the availableNow query did not stop by itself"
        assert query.exception() is None
        batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    finally:
        query.stop()

    assert source_records(spark.table(name)) == expected
    assert len(batches) >= 3, f"{len(batches)} micro-batches for 30 records at 10 per trigger"


class Feeder:
    """Produces ``value-0``, ``value-1``, ... into a topic from a thread, one every few
    milliseconds, until stopped."""

    def __init__(self, broker: BrokerProcess, topic: str) -> None:
        self.topic = topic
        self.sent = 0
        self.failed: list[KafkaError] = []
        self._producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._producer.produce(
                self.topic, f"value-{self.sent}".encode(), on_delivery=self._delivered
            )
            self.sent += 1
            self._producer.poll(0)
            time.sleep(0.005)

    def _delivered(self, error: KafkaError | None, _: Message) -> None:
        if error is not None:
            self.failed.append(error)

    def start(self) -> Feeder:
        self._thread.start()
        return self

    def wait_for(self, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.sent < count:
            assert time.monotonic() < deadline, f"only {self.sent} of {count} records produced"
            time.sleep(0.05)

    def stop(self) -> int:
        """Stop producing; how many records were produced, every one acknowledged."""
        self._stop.set()
        self._thread.join(10)
        assert self._producer.flush(30) == 0
        assert not self.failed, self.failed
        return self.sent


def wait_for_batches(query: StreamingQuery, count: int, timeout: float = 60) -> None:
    """Until ``query`` has completed ``count`` micro-batches that read records."""
    deadline = time.monotonic() + timeout
    while sum(p["numInputRows"] > 0 for p in query.recentProgress) < count:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"fewer than {count} batches: {query.recentProgress}"
        time.sleep(0.1)


def test_micro_batch_query_stopped_and_restarted_from_its_checkpoint_reads_each_record_once(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    """A processingTime query into a parquet sink, stopped while records keep arriving and
    started again on the same checkpoint, resumes where its last committed batch ended: in the
    end the sink holds every record exactly once. (The file sink commits a batch through its
    metadata log, so a batch cut short by stop() and run again leaves no duplicate; Kafka's
    sink is at-least-once and could.)"""
    topic = create_topic(broker, partitions=2)
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "output"

    def start() -> StreamingQuery:
        return (
            spark.readStream.format("kafka")
            .options(**kafka_options(broker, topic))
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("CAST(value AS STRING) AS value", "partition", "offset")
            .writeStream.format("parquet")
            .option("path", str(output))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="300 milliseconds")
            .start()
        )

    def written() -> list[tuple[str, int, int]]:
        return [(r.value, r.partition, r.offset) for r in spark.read.parquet(str(output)).collect()]

    feeder = Feeder(broker, topic).start()
    try:
        first = start()
        try:
            wait_for_batches(first, 2)
        finally:
            first.stop()
        assert first.exception() is None
        before_restart = len(written())
        feeder.wait_for(feeder.sent + 100)  # records that arrive while no query runs

        second = start()
        try:
            wait_for_batches(second, 1)
            total = feeder.stop()
            second.processAllAvailable()
        finally:
            second.stop()
        assert second.exception() is None
    finally:
        feeder.stop()

    rows = written()
    assert 0 < before_restart < total
    assert sorted(value for value, _, _ in rows) == sorted(f"value-{i}" for i in range(total))
    for partition in (0, 1):
        offsets = sorted(offset for _, p, offset in rows if p == partition)
        assert offsets == list(range(len(offsets))), f"partition {partition}"


def test_batch_write_to_the_kafka_sink(spark: SparkSession, broker: BrokerProcess) -> None:
    """df.write.format("kafka") produces each row once, with its key (null included), value,
    headers and the partition its column names, as confluent-kafka then reads them."""
    topic = create_topic(broker, partitions=2)
    rows = [
        (
            None if i % 5 == 0 else f"k{i}".encode(),
            f"v{i}".encode(),
            [("n", str(i).encode())],
            i % 2,
        )
        for i in range(40)
    ]
    df = spark.createDataFrame(
        rows,
        "key binary, value binary, headers array<struct<key: string, value: binary>>, "
        "partition int",
    )

    df.write.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap).option(
        "topic", topic
    ).save()

    got = consume_all(broker, topic, partitions=2, expected=len(rows))
    # two Spark tasks write each partition at once: the order within one is theirs to mix
    assert sorted((r.value, r.key, r.headers, r.partition) for r in got) == sorted(
        (value, key, tuple(headers), partition) for key, value, headers, partition in rows
    )
    for partition in (0, 1):
        offsets = [r.offset for r in got if r.partition == partition]
        assert offsets == list(range(len(offsets)))


def test_streaming_write_to_the_kafka_sink(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    """writeStream.format("kafka") from one topic into another, with a transformation on the
    way: the output topic holds each input record once, transformed, with its key and headers,
    at the same partition and offset (one Spark task reads a partition and writes it in order)."""
    source = create_topic(broker, partitions=2)
    sink = create_topic(broker, partitions=2)
    expected = produce(broker, source, 40, partitions=2)

    query = (
        spark.readStream.format("kafka")
        .options(**kafka_options(broker, source))
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .load()
        .selectExpr("key", "upper(CAST(value AS STRING)) AS value", "headers", "partition")
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(60), "the availableNow query did not stop by itself"
        assert query.exception() is None
    finally:
        query.stop()

    got = consume_all(broker, sink, partitions=2, expected=len(expected))
    assert [(r.partition, r.offset, r.key, r.value, r.headers) for r in got] == [
        (r.partition, r.offset, r.key, (r.value or b"").upper(), r.headers) for r in expected
    ]
