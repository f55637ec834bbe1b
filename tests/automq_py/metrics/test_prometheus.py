"""A real Prometheus scraping a real broker under load: what PromQL says of the scraped series
against what the clients, the S3 server and the broker's own summary measured."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import botocore.session
import pytest
from botocore.config import Config
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.automq_py.conftest import start_broker
from tests.support.broker import free_port
from tests.support.prometheus import Prometheus
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

RATE = 1500  # records/s offered
LOAD_S = 9.0
WINDOW_S = 6  # the rate is compared over the load's last seconds
RECORD = b"r" * 1000
READ_FIRST = 2000  # the group reads these, commits, and stops


def within(measured: float, expected: float, tolerance: float = 0.05) -> bool:
    return abs(measured - expected) <= tolerance * expected


def objects_stored(s3_server: SeaweedFS, namespace: str) -> int:
    """Objects of the cluster's namespace in the bucket (keys are ``<hash>/<namespace>/<id>``)."""
    client = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=s3_server.endpoint,
        region_name="us-east-1",
        aws_access_key_id=s3_server.access_key,
        aws_secret_access_key=s3_server.secret_key,
        config=Config(s3={"addressing_style": "path"}),
    )
    count = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3_server.bucket):
        count += sum(1 for o in page.get("Contents", []) if f"/{namespace}/" in o["Key"])
    client.close()
    return count


def test_promql_over_a_loaded_broker_matches_the_clients_and_the_s3_server(
    tmp_path: Path, s3_server: SeaweedFS
) -> None:
    metrics_port = free_port()
    cluster = f"prom{uuid.uuid4().hex[:8]}"
    broker = start_broker(
        tmp_path / "broker",
        s3_server,
        **{
            "cluster.id": cluster,
            "metrics.port": str(metrics_port),
            # an upload every ~0.7 s of the load: PUTs to count
            "s3.wal.upload.threshold": str(1 << 20),
        },
    )
    try:
        with Prometheus(tmp_path / "prometheus", [f"127.0.0.1:{metrics_port}"]) as prometheus:
            prometheus.wait_for('up{job="automq"} == 1')
            topic = f"load-{uuid.uuid4().hex[:6]}"
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            for f in admin.create_topics([NewTopic(topic, 2)]).values():
                f.result(30)

            delivered: list[float] = []  # when each record was acknowledged

            def on_delivery(error: KafkaError | None, _: Message) -> None:
                assert error is None, error
                delivered.append(time.time())

            producer = Producer(
                {"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5}
            )
            for _ in range(READ_FIRST):
                producer.produce(topic, RECORD, on_delivery=on_delivery)
            assert producer.flush(30) == 0

            group = f"stopped-{uuid.uuid4().hex[:6]}"
            consumer = Consumer(
                {
                    "bootstrap.servers": broker.bootstrap,
                    "group.id": group,
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                }
            )
            consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
            read: dict[int, int] = {}
            deadline = time.monotonic() + 30
            while sum(read.values()) < READ_FIRST and time.monotonic() < deadline:
                for m in consumer.consume(500, 0.5):
                    assert m.error() is None, m.error()
                    read[m.partition()] = m.offset() + 1
            assert sum(read.values()) == READ_FIRST  # offsets start at 0 in both partitions
            # both partitions, read or not: the sticky partitioner may have put every record
            # read here in one, and a partition without a committed offset has no lag
            consumer.commit(
                offsets=[TopicPartition(topic, p, read.get(p, 0)) for p in (0, 1)],
                asynchronous=False,
            )
            consumer.close()

            # the load: one produce() per record with a delivery callback, at a steady rate
            start = time.time()
            sent = 0
            while (now := time.time()) < start + LOAD_S:
                due = int((now - start) * RATE)
                while sent < due:
                    producer.produce(topic, RECORD, on_delivery=on_delivery)
                    sent += 1
                producer.poll(0.001)
            assert producer.flush(30) == 0
            end = start + LOAD_S
            produced = READ_FIRST + sent
            assert len(delivered) == produced

            time.sleep(3 * prometheus.interval_s)  # the scrapes after the load
            client_rate = sum(1 for t in delivered if end - WINDOW_S <= t < end) / WINDOW_S
            promql_rate = prometheus.value(
                f'rate(kafka_server_brokertopicmetrics_messagesin_total{{topic="{topic}"}}'
                f"[{WINDOW_S}s])",
                at=end,
            )
            lag = prometheus.value(f'sum(kafka_consumergroup_lag{{consumergroup="{group}"}})')
            p99 = prometheus.value(
                'kafka_network_requestmetrics_totaltimems{request="Produce",quantile="0.99"}'
            )
            puts = prometheus.value('sum(automq_s3_requests_total{operation="PutObject"})')
            stored = objects_stored(s3_server, f"_kafka_{cluster}")
    finally:
        assert broker.stop() == 0, broker.log_tail()
    summary = re.search(
        r"request total time PRODUCE: (\d+) requests, p50 [\d.]+ ms, p99 ([\d.]+) ms",
        broker.log_path.read_text(),
    )
    assert summary is not None, broker.log_tail()
    broker_p99 = float(summary.group(2))

    print(
        f"\nproduce rate: client {client_rate:.1f}/s, PromQL {promql_rate:.1f}/s; "
        f"lag: {produced - READ_FIRST} expected, PromQL {lag:.0f}; Produce p99: broker "
        f"{broker_p99:.2f} ms over {summary.group(1)} requests, PromQL {p99:.2f} ms; "
        f"S3 PUTs: {stored} objects stored, PromQL {puts:.0f}"
    )
    assert within(promql_rate, client_rate), (promql_rate, client_rate)
    assert within(lag, produced - READ_FIRST), (lag, produced)
    assert within(p99, broker_p99), (p99, broker_p99)
    assert stored > 5
    assert within(puts, stored), (puts, stored)
