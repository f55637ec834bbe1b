"""DescribeTopicPartitions (KIP-966, what Kafka 4's kafka-topics --describe sends) against the real
broker through kafka-python's admin client: topics sorted by name, paged by
``response_partition_limit`` with a cursor naming the first partition left out, unknown topics
answered UNKNOWN_TOPIC_OR_PARTITION (and not created), a cursor outside the topics asked for
refused with INVALID_REQUEST, as Kafka's KRaft broker answers. The tests only read: they share
one broker and its two topics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kafka.admin import KafkaAdminClient

from protocol.errors import ErrorCode
from tests.automq_py.clients.test_clients import create_topic
from tests.automq_py.conftest import module_broker
from tests.support.broker import BrokerProcess
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    with module_broker(tmp_path_factory, s3_server) as b:
        create_topic(b.bootstrap, "beta", 3)
        create_topic(b.bootstrap, "alpha", 2)
        yield b


@pytest.fixture
def admin(broker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        yield client
    finally:
        client.close()


def partitions(result: dict[str, Any]) -> list[tuple[str, int]]:
    return [(t["name"], p["partition_index"]) for t in result["topics"] for p in t["partitions"]]


def test_named_topics_come_sorted_with_their_partitions(admin: KafkaAdminClient) -> None:
    result = admin.describe_topic_partitions(["beta", "alpha"])
    assert result["next_cursor"] is None
    assert partitions(result) == [("alpha", 0), ("alpha", 1), ("beta", 0), ("beta", 1), ("beta", 2)]
    alpha = result["topics"][0]
    assert alpha["error_code"] == ErrorCode.NONE and not alpha["is_internal"]
    assert alpha["topic_id"] is not None
    p = alpha["partitions"][0]
    assert (p["leader_id"], p["replica_nodes"], p["isr_nodes"]) == (0, [0], [0])
    assert p["offline_replicas"] == []


def test_pages_follow_the_cursor_across_topics(admin: KafkaAdminClient) -> None:
    first = admin.describe_topic_partitions(["alpha", "beta"], response_partition_limit=3)
    assert partitions(first) == [("alpha", 0), ("alpha", 1), ("beta", 0)]
    assert first["next_cursor"] == {"topic_name": "beta", "partition_index": 1}
    rest = admin.describe_topic_partitions(
        ["alpha", "beta"], response_partition_limit=3, cursor=first["next_cursor"]
    )
    assert partitions(rest) == [("beta", 1), ("beta", 2)]
    assert rest["next_cursor"] is None
    # a page that ends exactly at a topic's end points at the next topic's first partition
    exact = admin.describe_topic_partitions(["alpha", "beta"], response_partition_limit=2)
    assert partitions(exact) == [("alpha", 0), ("alpha", 1)]
    assert exact["next_cursor"] == {"topic_name": "beta", "partition_index": 0}


def test_no_topic_named_describes_every_topic(admin: KafkaAdminClient) -> None:
    result = admin.describe_topic_partitions([])
    names = [t["name"] for t in result["topics"]]
    assert names == sorted(names)
    assert {"alpha", "beta"} <= set(names)


def test_an_unknown_topic_is_an_error_and_is_not_created(admin: KafkaAdminClient) -> None:
    result = admin.describe_topic_partitions(["alpha", "missing", "bad name!"])
    errors = {t["name"]: t["error_code"] for t in result["topics"]}
    assert errors == {
        "alpha": ErrorCode.NONE,
        "missing": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        "bad name!": ErrorCode.INVALID_TOPIC_EXCEPTION,
    }
    assert "missing" not in admin.list_topics()


def test_a_cursor_must_name_a_topic_asked_for(admin: KafkaAdminClient) -> None:
    result = admin.describe_topic_partitions(
        ["alpha"], cursor={"topic_name": "beta", "partition_index": 0}
    )
    assert [(t["name"], t["error_code"]) for t in result["topics"]] == [
        ("alpha", ErrorCode.INVALID_REQUEST)
    ]


def test_a_cursor_outside_the_topics_partitions_is_bounded(admin: KafkaAdminClient) -> None:
    """A cursor past a topic's last partition gives none of it; one below 0 is refused, as
    Kafka's "cursor partition must be valid": never a partition that does not exist."""
    past = admin.describe_topic_partitions(
        ["alpha", "beta"], cursor={"topic_name": "alpha", "partition_index": 9}
    )
    assert partitions(past) == [("beta", 0), ("beta", 1), ("beta", 2)]
    below = admin.describe_topic_partitions(
        ["beta"], cursor={"topic_name": "beta", "partition_index": -5}
    )
    assert [(t["name"], t["error_code"]) for t in below["topics"]] == [
        ("beta", ErrorCode.INVALID_REQUEST)
    ]


def test_a_limit_below_one_still_pages_forward(admin: KafkaAdminClient) -> None:
    """As Kafka's max(min(limit, 2000), 1): a response holds at least one partition, so a
    client paging with a limit of 0 gets through the topics."""
    result = admin.describe_topic_partitions(["alpha", "beta"], response_partition_limit=0)
    assert partitions(result) == [("alpha", 0)]
    assert result["next_cursor"] == {"topic_name": "alpha", "partition_index": 1}
