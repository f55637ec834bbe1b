"""``/readyz`` and ``/healthz`` on the metrics port, across a kill -9 and the WAL's recovery."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from automq_py.health import check_ready
from tests.automq_py.conftest import start_broker
from tests.support.broker import free_port
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

UNACKED_MIB = 60  # in the WAL and not uploaded at the kill: the restart replays it


def probe(port: int, path: str) -> tuple[int, str]:
    """(status, body) of GET ``path``; (0, why) when nothing answered."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def fill_the_wal(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20})
    payload = b"w" * 100_000
    for _ in range(UNACKED_MIB * 10):
        producer.produce(topic, payload)
        producer.poll(0)
    assert producer.flush(60) == 0


def test_readyz_is_not_ready_while_the_wal_recovers_after_a_kill(
    tmp_path: Path, s3_server: SeaweedFS
) -> None:
    metrics_port = free_port()
    broker = start_broker(
        tmp_path / "broker",
        s3_server,
        **{
            "metrics.port": str(metrics_port),
            # everything stays in the WAL until the kill
            "s3.wal.capacity": str(512 << 20),
            "s3.wal.upload.threshold": str(200 << 20),
            "s3.wal.upload.interval.ms": "600000",
        },
    )
    try:
        assert probe(metrics_port, "/readyz") == (200, "ready\n")
        assert probe(metrics_port, "/healthz") == (200, "ok\n")
        assert check_ready("127.0.0.1", metrics_port, 2.0) is None
        topic = f"replayed-{uuid.uuid4().hex[:6]}"
        fill_the_wal(broker.bootstrap, topic)
        broker.kill()
        assert probe(metrics_port, "/readyz")[0] == 0  # the process is gone

        broker.start_process()
        seen: list[tuple[int, str]] = []
        healthz: set[int] = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status, body = probe(metrics_port, "/readyz")
            if status:
                seen.append((status, body))
                healthz.add(probe(metrics_port, "/healthz")[0])
            if status == 200:
                break
            time.sleep(0.02)
        not_ready = [body for status, body in seen if status == 503]
        assert not_ready, seen[:5]
        assert any("recovering the WAL" in body for body in not_ready), not_ready[:5]
        assert seen[-1] == (200, "ready\n"), seen[-5:]
        assert healthz == {200}  # alive all along: a replay is no reason to restart it
        # ready means serving: the replayed records are there
        done = subprocess.run(
            [sys.executable, "-m", "automq_py.health", "--readyz", f"127.0.0.1:{metrics_port}"]
        )
        assert done.returncode == 0
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused"})
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), 10) == (0, UNACKED_MIB * 10)
        consumer.close()
        ends = {
            s.labels["topic"]: s.value
            for family in text_string_to_metric_families(probe(metrics_port, "/metrics")[1])
            if family.name == "kafka_log_log_logendoffset"
            for s in family.samples
            if s.labels["partition"] == "0"
        }
        assert ends[topic] == UNACKED_MIB * 10
    finally:
        assert broker.stop() == 0, broker.log_tail()
    refused = subprocess.run(
        [sys.executable, "-m", "automq_py.health", "--readyz", f"127.0.0.1:{metrics_port}"],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1 and "unhealthy" in refused.stderr
