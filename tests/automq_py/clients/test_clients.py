"""Standard Kafka clients against the real broker process, storing in the real S3 server. The
round trips share one broker, each with its own topic; the tests that stop or kill their broker
start their own."""

from __future__ import annotations

import asyncio
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from protocol import record_batch
from tests.automq_py.conftest import MakeBroker, module_broker
from tests.support.broker import BrokerProcess
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

N = 10_000
PARTITIONS = 3


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(15)


def produce_confluent(bootstrap: str, topic: str, compression: str) -> dict[int, list[tuple]]:
    """Produce N keyed records with headers; return what each partition should hold, in order."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "compression.type": compression,
            "linger.ms": 5,
            "enable.idempotence": False,
        }
    )
    expected: dict[int, list[tuple]] = {p: [] for p in range(PARTITIONS)}
    base_ts = int(time.time() * 1000)
    for i in range(N):
        p = i % PARTITIONS
        key, value, ts = f"key-{i}".encode(), f"value-{i}-{'x' * (i % 50)}".encode(), base_ts + i
        headers = [("index", str(i).encode()), ("h2", b"")]
        producer.produce(topic, value, key, partition=p, timestamp=ts, headers=headers)
        expected[p].append((key, value, ts, headers))
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    return expected


def consume_and_check(bootstrap: str, topic: str, expected: dict[int, list[tuple]]) -> None:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in expected])
    got: dict[int, list[tuple]] = {p: [] for p in expected}
    deadline = time.monotonic() + 60
    while sum(map(len, got.values())) < N and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        p = msg.partition()
        assert msg.offset() == len(got[p])  # offsets are dense and in order
        got[p].append((msg.key(), msg.value(), msg.timestamp()[1], msg.headers()))
    consumer.close()
    for p in expected:
        assert got[p] == expected[p], f"partition {p} differs"


def stored_codecs(bootstrap: str, topic: str, partition: int) -> set[str]:
    """The codecs of the batches a Fetch v4 returns from offset 0 (a client could silently
    fall back to no compression: librdkafka does when it thinks the broker too old)."""
    name = topic.encode()
    body = struct.pack(">iiiib", -1, 100, 1, 1 << 20, 0)
    body += struct.pack(">ih", 1, len(name)) + name
    body += struct.pack(">iiqi", 1, partition, 0, 1 << 20)
    header = struct.pack(">hhih", 1, 4, 99, 4) + b"test"
    with socket.create_connection(tuple(bootstrap.split(":")), timeout=10) as s:  # type: ignore[arg-type]
        s.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
        size = struct.unpack(">i", _recv(s, 4))[0]
        data = _recv(s, size)
    pos = 4 + 4 + 4  # correlation id, throttle time, topics count
    (name_len,) = struct.unpack_from(">h", data, pos)
    pos += 2 + name_len + 4 + 4 + 2 + 8 + 8  # name, partitions count, index, error, hw, lso
    (aborted,) = struct.unpack_from(">i", data, pos)
    pos += 4 + max(aborted, 0) * 16
    (records_len,) = struct.unpack_from(">i", data, pos)
    records = data[pos + 4 : pos + 4 + records_len]
    return {h.compression for h, _ in record_batch.iter_batches(records)}


def _recv(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, "connection closed"
        out += chunk
    return out


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    """The module's broker, for the tests that neither stop nor kill it."""
    with module_broker(tmp_path_factory, s3_server) as b:
        yield b


@pytest.mark.parametrize("compression", ["gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_round_trip(broker: BrokerProcess, compression: str) -> None:
    topic = f"orders-{compression}"
    create_topic(broker.bootstrap, topic)
    expected = produce_confluent(broker.bootstrap, topic, compression)
    consume_and_check(broker.bootstrap, topic, expected)
    # librdkafka sends a batch uncompressed when compressing would not shrink it
    codecs = stored_codecs(broker.bootstrap, topic, 0)
    assert compression.upper() in codecs and codecs <= {compression.upper(), "NONE"}, codecs


def test_acknowledged_records_survive_kill_9(make_broker: MakeBroker) -> None:
    broker = make_broker()
    create_topic(broker.bootstrap, "durable")
    expected = produce_confluent(broker.bootstrap, "durable", "lz4")
    broker.kill()
    broker.start()
    consume_and_check(broker.bootstrap, "durable", expected)


def test_reads_come_from_object_storage_after_a_restart(
    make_broker: MakeBroker, s3_server: SeaweedFS
) -> None:
    broker = make_broker()
    create_topic(broker.bootstrap, "cold")
    expected = produce_confluent(broker.bootstrap, "cold", "lz4")
    assert broker.stop() == 0  # a clean stop uploads the cache and trims the WAL
    broker.start()  # a new process: its LogCache is empty, every read goes to S3
    consume_and_check(broker.bootstrap, "cold", expected)
    # the bucket's objects hold the topic's MetaStreams and data streams
    cluster = broker.overrides["cluster.id"]
    keys = asyncio.run(_object_keys(s3_server, f"_kafka_{cluster}/"))
    assert keys
    outputs = [
        subprocess.run(
            [
                sys.executable,
                "-m",
                "automq_py",
                "inspect",
                "--store",
                s3_server.url(),
                key,
                "--records",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        for key in keys
    ]
    text = "\n".join(outputs)
    assert "indexStartPosition:" in text and "objectId=" in text
    assert 'key=LOG, value={"streamMap":{"log":' in text
    assert "compressionType=LZ4" in text, [o.splitlines()[:12] for o in outputs]


async def _object_keys(s3_server: SeaweedFS, namespace: str) -> list[str]:
    from storage.operator import open_object_store

    store = open_object_store(s3_server.url())
    try:
        return [info.key async for info in store.list() if namespace in info.key]
    finally:
        await store.close()


async def test_aiokafka_round_trip(make_broker: MakeBroker) -> None:
    broker = make_broker()
    from aiokafka import AIOKafkaProducer

    create_topic(broker.bootstrap, "aio")
    producer = AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap, compression_type="zstd", acks="all", linger_ms=5
    )
    await producer.start()
    base_ts = int(time.time() * 1000)
    futures = []
    expected: dict[int, list[tuple]] = {p: [] for p in range(PARTITIONS)}
    for i in range(N):
        p, ts = i % PARTITIONS, base_ts + i
        key, value = f"k{i}".encode(), f"v{i}".encode()
        headers = [("i", str(i).encode())]
        futures.append(
            await producer.send(
                "aio", value, key=key, partition=p, timestamp_ms=ts, headers=headers
            )
        )
        expected[p].append((key, value, ts, headers))
    offsets = [(await f).offset for f in futures]
    await producer.stop()
    for p in range(PARTITIONS):
        assert offsets[p::PARTITIONS] == list(range(len(expected[p])))
    assert await aiokafka_read(broker.bootstrap) == expected
    # the same after a crash (kill -9), then from object storage after a clean restart
    for restart in (broker.kill, broker.stop):
        restart()
        broker.start()
        assert await aiokafka_read(broker.bootstrap) == expected


async def aiokafka_read(bootstrap: str) -> dict[int, list[tuple]]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as TP

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    consumer.assign([TP("aio", p) for p in range(PARTITIONS)])
    for p in range(PARTITIONS):
        consumer.seek(TP("aio", p), 0)
    got: dict[int, list[tuple]] = {p: [] for p in range(PARTITIONS)}
    while sum(map(len, got.values())) < N:
        batch = await consumer.getmany(timeout_ms=5000)
        assert batch, f"stalled after {sum(map(len, got.values()))} records"
        for tp, records in batch.items():
            for r in records:
                assert r.offset == len(got[tp.partition])
                got[tp.partition].append((r.key, r.value, r.timestamp, list(r.headers)))
    await consumer.stop()
    return got
