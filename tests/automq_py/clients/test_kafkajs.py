"""kafkajs 2.2.4 (Node) produces to the real broker process; confluent-kafka reads it back.

``tests/js/roundtrip.js`` creates the topic, produces, and prints every record with the offset
the broker acknowledged. kafkajs consumers need consumer groups, so the read-back uses
confluent-kafka's ``assign``, which needs none. Runs with and without kafkajs' idempotent
producer (InitProducerId, sequence numbers).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, TopicPartition

from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.integration

N = 10_000
PARTITIONS = 3
SCRIPT = Path(__file__).resolve().parents[2] / "js" / "roundtrip.js"

Header = tuple[str, str | bytes | None]  # as confluent-kafka returns them
Record = tuple[int, bytes, bytes, int, list[Header]]  # offset, key, value, ts, headers


def produce_with_kafkajs(bootstrap: str, topic: str, idempotent: bool) -> dict[int, list[Record]]:
    node = shutil.which("node")
    assert node is not None, "node is not installed"
    assert (SCRIPT.parent / "node_modules" / "kafkajs").is_dir(), "run `make deps` first"
    done = subprocess.run(
        [node, str(SCRIPT), bootstrap, topic, str(N), str(PARTITIONS)]
        + (["--idempotent"] if idempotent else []),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    expected: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
    for line in done.stdout.decode().splitlines():
        r: dict[str, Any] = json.loads(line)
        headers: list[Header] = [(name, value.encode()) for name, value in r["headers"].items()]
        record = (r["offset"], r["key"].encode(), r["value"].encode(), r["timestamp"], headers)
        expected[r["partition"]].append(record)
    return expected


def read_with_assign(bootstrap: str, topic: str, count: int) -> dict[int, list[Record]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + 60
    try:
        while sum(map(len, got.values())) < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            key, value, headers = msg.key(), msg.value(), msg.headers()
            assert key is not None and value is not None and isinstance(headers, list)
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None
            ts_type, ts = msg.timestamp()
            assert ts_type == TIMESTAMP_CREATE_TIME, f"partition {partition} offset {offset}"
            got[partition].append((offset, key, value, ts, headers))
    finally:
        consumer.close()
    return got


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_kafkajs_produce_read_back(broker: BrokerProcess, idempotent: bool) -> None:
    expected = produce_with_kafkajs(broker.bootstrap, "kafkajs-orders", idempotent)
    assert sum(map(len, expected.values())) == N
    for p, records in expected.items():
        acked = [offset for offset, *_ in records]
        assert acked == list(range(len(records))), f"partition {p}: acked offsets not dense"

    check(read_with_assign(broker.bootstrap, "kafkajs-orders", N), expected)
    # the same after a crash (kill -9), then from object storage after a clean restart
    for restart in (broker.kill, broker.stop):
        restart()
        broker.start()
        check(read_with_assign(broker.bootstrap, "kafkajs-orders", N), expected)


def check(got: dict[int, list[Record]], expected: dict[int, list[Record]]) -> None:
    for p in range(PARTITIONS):
        assert len(got[p]) == len(expected[p]), f"partition {p}"
        for have, want in zip(got[p], expected[p], strict=True):
            assert have == want, f"partition {p} offset {want[0]}"
