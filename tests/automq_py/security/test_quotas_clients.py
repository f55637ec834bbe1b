"""Client quotas against the real broker: set and described with Kafka's ``kafka-configs``,
enforced on confluent-kafka producers and consumers (the broker tells them ``throttle_time_ms``
and they wait), while a client without a quota is not slowed."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import (
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
)
from kafka.protocol.consumer.fetch import FetchResponse

from tests.automq_py.conftest import module_broker
from tests.support.broker import BrokerProcess
from tests.support.java import run_tool
from tests.support.raw_connection import RawConnection, fetch_request
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

QUOTA = 200_000  # B/s
SENT = 1_000_000  # 1 s of it passes at once, the rest at the quota: ~4 s
RECORD = 10_000


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    with module_broker(tmp_path_factory, s3_server) as b:
        yield b


def kafka_configs(broker: BrokerProcess, *args: str) -> str:
    return run_tool("kafka-configs", "--bootstrap-server", broker.bootstrap, *args).stdout


def produce(broker: BrokerProcess, topic: str, client_id: str) -> tuple[float, float]:
    """Produce SENT bytes as ``client_id``, a record a request: the seconds it took and the
    longest throttle time the broker told the client.

    A throttle holds back the requests after the one that went over (the broker mutes the
    connection, as Kafka does), never that one: the records go one a request so that what
    follows an overdrawn request is always held, however librdkafka would have batched them
    (a big last batch is answered at once, with its throttle time, and nothing is left to
    hold)."""
    throttles: list[float] = []

    def stats(raw: str) -> None:
        for b in json.loads(raw).get("brokers", {}).values():
            if b.get("throttle", {}).get("cnt", 0):
                throttles.append(b["throttle"]["max"])

    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "client.id": client_id,
            "acks": "all",
            "batch.num.messages": 1,
            "statistics.interval.ms": 500,
            "stats_cb": stats,
        }
    )
    payload = os.urandom(RECORD)
    start = time.monotonic()
    for _ in range(SENT // RECORD):
        producer.produce(topic, payload)
        producer.poll(0)
    assert producer.flush(60) == 0
    took = time.monotonic() - start
    producer.poll(1.0)  # the last statistics
    return took, max(throttles, default=0.0)


def test_a_producer_over_its_quota_is_throttled_and_another_is_not(broker: BrokerProcess) -> None:
    topic = f"quota-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic(topic, 1)]).values():
        f.result(30)
    kafka_configs(
        broker,
        "--alter",
        "--add-config",
        f"producer_byte_rate={QUOTA}",
        "--entity-type",
        "clients",
        "--entity-name",
        "slow",
    )
    described = kafka_configs(
        broker, "--describe", "--entity-type", "clients", "--entity-name", "slow"
    )
    assert f"producer_byte_rate={float(QUOTA)}" in described, described
    fast_s, fast_throttle = produce(broker, topic, "fast")
    slow_s, slow_throttle = produce(broker, topic, "slow")
    # 1 MB at 200 kB/s, the first 200 kB at once: ~4 s throttled, each request past those told
    # the time its own 10 kB take at the quota
    assert slow_throttle >= 0.9 * RECORD / QUOTA * 1000, slow_throttle
    assert slow_s > 3.0 and slow_s > 2 * fast_s, (slow_s, fast_s)
    assert fast_throttle == 0
    kafka_configs(
        broker,
        "--alter",
        "--delete-config",
        "producer_byte_rate",
        "--entity-type",
        "clients",
        "--entity-name",
        "slow",
    )
    again_s, _ = produce(broker, topic, "slow")
    assert again_s < slow_s / 2, (again_s, slow_s)


def test_a_consumer_over_its_quota_is_throttled(broker: BrokerProcess) -> None:
    topic = f"quota-read-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic(topic, 1)]).values():
        f.result(30)
    # Twice what one fetch returns (max.partition.fetch.bytes is 1 MiB): the first fetch can
    # take a whole megabyte at once, the second has to wait out its throttle.
    produce(broker, topic, "writer")
    produce(broker, topic, "writer")
    kafka_configs(
        broker,
        "--alter",
        "--add-config",
        f"consumer_byte_rate={QUOTA}",
        "--entity-type",
        "users",
        "--entity-default",
    )
    throttles: list[float] = []

    def stats(raw: str) -> None:
        for b in json.loads(raw).get("brokers", {}).values():
            if b.get("throttle", {}).get("cnt", 0):
                throttles.append(b["throttle"]["max"])

    settings: dict[str, Any] = {
        "bootstrap.servers": broker.bootstrap,
        "group.id": "unused",
        "statistics.interval.ms": 500,
        "stats_cb": stats,
    }
    consumer = Consumer(settings)
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = 0
    start = time.monotonic()
    try:
        while got < 2 * SENT and time.monotonic() - start < 60:
            for m in consumer.consume(100, 0.5):
                if m.error() is None:
                    got += len(m.value() or b"")
        took = time.monotonic() - start
        consumer.consume(100, 1.0)  # serves the statistics of the last interval
    finally:
        consumer.close()
    kafka_configs(
        broker,
        "--alter",
        "--delete-config",
        "consumer_byte_rate",
        "--entity-type",
        "users",
        "--entity-default",
    )
    assert got == 2 * SENT
    assert max(throttles, default=0) > 1000, throttles
    assert took > 3.0, took


def test_a_request_quota_counts_handling_not_waiting(broker: BrokerProcess) -> None:
    """As Kafka's ClientRequestQuotaManager, which counts a request's time on the handler
    threads: fetches that wait out their max_wait at the log end are not throttled for the
    wait, while requests whose handling goes past the quota are, and their responses say so
    (the client throttles itself too, KIP-219)."""
    topic = f"quota-poll-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic(topic, 1)]).values():
        f.result(30)
    client = f"poller-{uuid.uuid4().hex[:6]}"
    kafka_configs(
        broker,
        "--alter",
        "--add-config",
        "request_percentage=1",  # 10 ms of handling a second
        "--entity-type",
        "clients",
        "--entity-name",
        client,
    )
    fetch = fetch_request(topic, {0: 0}, max_wait_ms=400, min_bytes=1, version=12)
    with RawConnection(broker.bootstrap, client_id=client) as conn:
        started = time.monotonic()
        for _ in range(4):
            answer = conn.call(fetch, FetchResponse)
            assert answer.responses[0].partitions[0].error_code == 0
        took = time.monotonic() - started
        # a throttle for each wait (400 ms against 10 ms a second) would hold the next fetch
        # for seconds
        assert took < 4 * 0.4 + 1.5, took
        describe = DescribeConfigsRequest[4](
            resources=[
                DescribeConfigsRequest.DescribeConfigsResource(
                    resource_type=2, resource_name=topic, configuration_keys=None
                )
            ],
            include_synonyms=True,
            include_documentation=True,
        )
        throttles = []
        for _ in range(500):
            throttles.append(conn.call(describe, DescribeConfigsResponse).throttle_time_ms)
            if throttles[-1] > 0:
                break
        assert throttles[-1] > 0, f"no throttle in {len(throttles)} DescribeConfigs requests"


def _create_topics(names: list[str], partitions: int, version: int) -> Any:
    topics = [
        CreateTopicsRequest.CreatableTopic(
            name=n, num_partitions=partitions, replication_factor=1, assignments=[], configs=[]
        )
        for n in names
    ]
    return CreateTopicsRequest[version](topics=topics, timeout_ms=10_000, validate_only=False)


def test_a_client_over_its_controller_mutation_rate_is_refused_then_throttled(
    broker: BrokerProcess,
) -> None:
    """KIP-599, as Kafka's controller enforces ``controller_mutation_rate``: the partitions a
    client creates or deletes come from a bucket of 11 s of the rate. CreateTopics v6+ and
    DeleteTopics v5+ refuse a topic with THROTTLING_QUOTA_EXCEEDED once the client is in
    debt, the response saying how long to wait; an older version is served and throttled."""
    client = f"mutator-{uuid.uuid4().hex[:6]}"
    kafka_configs(
        broker,
        "--alter",
        "--add-config",
        "controller_mutation_rate=1",  # a partition a second, 11 at once
        "--entity-type",
        "clients",
        "--entity-name",
        client,
    )
    names = [f"mutated-{uuid.uuid4().hex[:6]}-{i}" for i in range(4)]
    # each connection once: a throttled one is muted for the throttle time (KIP-219)
    with RawConnection(broker.bootstrap, client_id=client) as conn:
        answer = conn.call(_create_topics(names[:3], 10, 7), CreateTopicsResponse)
    errors = [t.error_code for t in answer.topics]
    # 10 of 11 taken, then 10 more on the credit left (the check comes before the taking),
    # then in debt: refused
    assert errors == [0, 0, 89], errors
    assert answer.topics[2].error_message == "The throttling quota has been exceeded."
    assert 7_000 <= answer.throttle_time_ms <= 9_000, answer.throttle_time_ms
    with RawConnection(broker.bootstrap, client_id=client) as conn:
        deleted = conn.call(
            DeleteTopicsRequest[6](
                topics=[DeleteTopicsRequest.DeleteTopicState(name=names[0], topic_id=None)],
                timeout_ms=10_000,
            ),
            DeleteTopicsResponse,
        )
    assert [r.error_code for r in deleted.responses] == [89]
    assert deleted.throttle_time_ms > 0
    with RawConnection(broker.bootstrap, client_id=client) as conn:
        old = conn.call(_create_topics([names[3]], 2, 5), CreateTopicsResponse)
    assert [t.error_code for t in old.topics] == [0]
    assert old.throttle_time_ms >= answer.throttle_time_ms
    # another client is not held back
    with RawConnection(broker.bootstrap, client_id="free") as conn:
        free = conn.call(
            DeleteTopicsRequest[6](
                topics=[DeleteTopicsRequest.DeleteTopicState(name=names[0], topic_id=None)],
                timeout_ms=10_000,
            ),
            DeleteTopicsResponse,
        )
    assert [r.error_code for r in free.responses] == [0] and free.throttle_time_ms == 0
