"""Clients against a three-broker cluster: any broker bootstraps them, leaders are spread,
records and committed offsets go through whichever broker leads."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from tests.cluster.conftest import ClusterFactory


def _create(cluster_admin, topic: str, partitions: int) -> None:  # type: ignore[no-untyped-def]
    futures = cluster_admin.create_topics([NewTopic(topic, partitions, replication_factor=3)])
    futures[topic].result(timeout=30)


def _produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    failed: list[object] = []
    for i in range(count):
        producer.produce(
            topic,
            key=str(i).encode(),
            value=f"v{i}".encode(),
            on_delivery=lambda err, _msg: failed.append(err) if err else None,
        )
    assert producer.flush(60) == 0
    assert failed == []


def _consume_all(bootstrap: str, topic: str, count: int, group: str) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            got.append(msg.value())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return got


def test_leaders_are_spread_and_every_broker_tells_the_same(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(brokers=3)
    _create(cluster.admin(0), "spread", 6)
    leaders = cluster.leaders("spread", via=0)
    assert sorted(Counter(leaders.values()).values()) == [2, 2, 2]
    for via in (1, 2):
        assert cluster.leaders("spread", via=via) == leaders


def test_records_go_through_any_broker(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(brokers=3)
    _create(cluster.admin(1), "orders", 6)
    _produce(cluster.brokers[2].bootstrap, "orders", 3000)
    got = _consume_all(cluster.brokers[0].bootstrap, "orders", 3000, "g1")
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(3000))
    # the group's offsets were committed through its coordinator, wherever it is
    consumer = Consumer({"bootstrap.servers": cluster.brokers[1].bootstrap, "group.id": "g1"})
    try:
        committed = consumer.committed([TopicPartition("orders", p) for p in range(6)], 30)
    finally:
        consumer.close()
    assert sum(tp.offset for tp in committed) == 3000


def test_a_broker_stopping_hands_its_partitions_over(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(brokers=3)
    _create(cluster.admin(0), "handover", 6)
    _produce(cluster.bootstrap, "handover", 600)
    assert cluster.brokers[2].stop() == 0
    leaders = cluster.leaders("handover", via=0)
    assert set(leaders.values()) <= {0, 1}
    _produce(cluster.brokers[0].bootstrap, "handover", 600)
    got = _consume_all(cluster.brokers[1].bootstrap, "handover", 1200, "g2")
    assert Counter(got) == Counter({f"v{i}".encode(): 2 for i in range(600)})


def test_kafka_python_through_any_broker(cluster_factory: ClusterFactory) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KPNewTopic

    cluster = cluster_factory(brokers=3)
    admin = KafkaAdminClient(bootstrap_servers=cluster.brokers[2].bootstrap)
    try:
        admin.create_topics([KPNewTopic("kp", 6, 3)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=cluster.brokers[0].bootstrap, acks="all")
    for i in range(600):
        producer.send("kp", f"k{i}".encode())
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(
        "kp",
        bootstrap_servers=cluster.brokers[1].bootstrap,
        group_id="kp-group",
        auto_offset_reset="earliest",
        consumer_timeout_ms=15000,
    )
    got: list[bytes] = []
    try:
        for message in consumer:
            got.append(message.value)
            if len(got) == 600:
                break
    finally:
        consumer.close()
    assert sorted(got) == sorted(f"k{i}".encode() for i in range(600))


def test_a_topic_deleted_and_created_again(cluster_factory: ClusterFactory) -> None:
    """Deleted through one broker, its partitions closed on every broker; the name taken again
    serves only the new topic's records."""
    cluster = cluster_factory(brokers=3)
    admin = cluster.admin(2)
    _create(admin, "again", 6)
    _produce(cluster.bootstrap, "again", 300)
    admin.delete_topics(["again"])["again"].result(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        try:
            _create(admin, "again", 3)
            break
        except Exception:  # the deletion is still settling on some broker
            assert time.monotonic() < deadline
            time.sleep(0.5)
    producer = Producer({"bootstrap.servers": cluster.bootstrap})
    for i in range(60):
        producer.produce("again", value=f"new{i}".encode())
    assert producer.flush(30) == 0
    got = _consume_all(cluster.brokers[0].bootstrap, "again", 60, "g-again")
    assert sorted(got) == sorted(f"new{i}".encode() for i in range(60))


def test_a_reassignment_is_listed_until_its_leader_hands_the_partition_over(
    cluster_factory: ClusterFactory,
) -> None:
    """AlterPartitionReassignments answers at once; the partition's leader carries the move out.
    While its leader is frozen the reassignment is listed, and it can be cancelled."""
    from kafka import TopicPartition as KPTopicPartition
    from kafka.admin import KafkaAdminClient

    # a session long enough that the frozen broker is not fenced meanwhile
    cluster = cluster_factory(brokers=3, **{"broker.session.timeout.ms": "30000"})
    _create(cluster.admin(0), "moving", 3)
    controller = cluster.controller()  # the admin client's requests go there
    frozen, other = (n for n in range(3) if n != controller)
    index = next(i for i, leader in cluster.leaders("moving").items() if leader == frozen)
    tp = KPTopicPartition("moving", index)
    admin = KafkaAdminClient(bootstrap_servers=cluster.brokers[controller].bootstrap)
    victim = cluster.brokers[frozen]
    assert victim.pid is not None
    try:
        assert admin.list_partition_reassignments() == {}  # it knows the controller now
        os.kill(victim.pid, signal.SIGSTOP)  # well within its session: not fenced
        try:
            assert admin.alter_partition_reassignments({tp: [other]})[tp] is None
            listed = admin.list_partition_reassignments()
            assert listed == {
                tp: {"replicas": [other], "adding_replicas": [other], "removing_replicas": [frozen]}
            }
            assert admin.alter_partition_reassignments({tp: None})[tp] is None  # cancelled
            assert admin.list_partition_reassignments() == {}
            assert admin.alter_partition_reassignments({tp: [controller]})[tp] is None
        finally:
            os.kill(victim.pid, signal.SIGCONT)
        deadline = time.monotonic() + 20
        while (
            cluster.leaders("moving")[index] != controller or admin.list_partition_reassignments()
        ):
            assert time.monotonic() < deadline, cluster.leaders("moving")
            time.sleep(0.1)
    finally:
        admin.close()
    _produce(cluster.bootstrap, "moving", 30)


def test_each_broker_describes_the_logs_it_leads(cluster_factory: ClusterFactory) -> None:
    """DescribeLogDirs in a cluster: every broker answers for the partitions it leads, the only
    logs it holds (a partition has one replica), with no error for those led elsewhere."""
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KPNewTopic

    cluster = cluster_factory(brokers=3)
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        admin.create_topics([KPNewTopic("dirs", 6, 1)])
        leaders = cluster.leaders("dirs")
        assert set(leaders.values()) == {0, 1, 2}
        for asked in (None, {"dirs": list(range(6))}):
            # every log: those the leaders have opened (as in Kafka, a broker creates the logs
            # of a new topic's partitions soon after CreateTopics is answered, not before)
            deadline = time.monotonic() + 10
            while True:
                described: dict[int, int] = {}
                answers = admin.describe_log_dirs(topic_partitions=asked)
                assert len(answers) == 3
                for answer in answers:
                    [result] = answer["log_dirs"]
                    assert result["error_code"] == 0, result
                    for topic in result["topics"]:
                        if topic["name"] == "dirs":
                            for p in topic["partitions"]:
                                described[p["partition_index"]] = answer["broker"]
                if described == leaders or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert described == leaders
    finally:
        admin.close()


def test_a_cluster_wide_dynamic_default_is_in_effect_on_every_broker(
    cluster_factory: ClusterFactory,
) -> None:
    """A cluster-wide broker default (kafka-configs --entity-default) set through one broker
    is in effect on the others too; a broker's own dynamic config stays its own."""
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ConfigSource,
        ResourceType,
    )

    from tests.automq_py.apis.test_config_surface import alter_cluster_defaults

    cluster = cluster_factory(brokers=2)

    def alter(via: int, name: str, **configs: str) -> None:
        resource = ConfigResource(
            ResourceType.BROKER,
            name,
            incremental_configs=[
                ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
                for k, v in configs.items()
            ],
        )
        admin = cluster.admin(via)
        admin.incremental_alter_configs([resource])[resource].result(timeout=30)

    def described(node: int) -> dict[str, ConfigEntry]:
        resource = ConfigResource(ResourceType.BROKER, str(node))
        admin = cluster.admin(node)
        return dict(admin.describe_configs([resource])[resource].result(timeout=30))

    alter_cluster_defaults(cluster.brokers[0], log_retention_ms="60000")
    alter(1, "1", log_cleaner_backoff_ms="20000")
    deadline = time.monotonic() + 10
    while True:
        on_1 = described(1)["log.retention.ms"]
        if on_1.value == "60000" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (on_1.value, on_1.source) == ("60000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    backoff = {node: described(node)["log.cleaner.backoff.ms"] for node in (0, 1)}
    assert (backoff[1].value, backoff[1].source) == (
        "20000",
        ConfigSource.DYNAMIC_BROKER_CONFIG.value,
    )
    assert backoff[0].value == "15000"


def test_a_topic_config_altered_through_one_broker_acts_on_every_leader(
    cluster_factory: ClusterFactory,
) -> None:
    """A topic's configs altered through any broker reach the partitions open on the others:
    a max.message.bytes lowered through broker 0 refuses a larger record on broker 1's
    partition."""
    from confluent_kafka import KafkaError
    from kafka.protocol.admin import IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse

    from tests.support.raw_connection import RawConnection

    cluster = cluster_factory(brokers=2)
    _create(cluster.admin(0), "limits", 2)
    on_1 = next(p for p, leader in cluster.leaders("limits").items() if leader == 1)
    producer = Producer({"bootstrap.servers": cluster.brokers[1].bootstrap, "linger.ms": 0})
    errors: list[KafkaError | None] = []

    def send(size: int) -> KafkaError | None:
        errors.clear()
        producer.produce(
            "limits", b"x" * size, partition=on_1, on_delivery=lambda e, _: errors.append(e)
        )
        assert producer.flush(30) == 0
        return errors[0]

    assert send(5000) is None  # opens the partition on broker 1 with the default limit
    resources = IncrementalAlterConfigsRequest.AlterConfigsResource
    request = IncrementalAlterConfigsRequest[1](
        resources=[
            resources(
                resource_type=2,  # TOPIC
                resource_name="limits",
                configs=[
                    resources.AlterableConfig(
                        name="max.message.bytes", config_operation=0, value="2000"
                    )
                ],
            )
        ],
        validate_only=False,
    )
    conn = RawConnection(cluster.brokers[0].bootstrap)  # not the partition's leader
    try:
        (result,) = conn.call(request, IncrementalAlterConfigsResponse).responses
    finally:
        conn.close()
    assert result.error_code == 0
    deadline = time.monotonic() + 10
    while (refused := send(5000)) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert refused is not None and refused.code() == KafkaError.MSG_SIZE_TOO_LARGE


def test_delete_records_on_a_partition_led_elsewhere_is_not_leader(
    cluster_factory: ClusterFactory,
) -> None:
    """DeleteRecords sent to a broker for a partition another one leads (an admin client's
    stale metadata) is answered NOT_LEADER_OR_FOLLOWER for that partition, as Kafka answers
    it; the request's other partitions are trimmed and the connection goes on. Through the
    cluster the admin client trims both."""
    from kafka.protocol.admin import DeleteRecordsRequest, DeleteRecordsResponse

    from tests.support.raw_connection import RawConnection

    cluster = cluster_factory(brokers=2)
    _create(cluster.admin(0), "trim", 2)
    _produce(cluster.bootstrap, "trim", 40)
    leaders = cluster.leaders("trim")
    assert sorted(leaders.values()) == [0, 1]
    mine = next(p for p, leader in leaders.items() if leader == 0)
    other = 1 - mine
    topic = DeleteRecordsRequest.DeleteRecordsTopic
    request = DeleteRecordsRequest[2](
        topics=[
            topic(
                name="trim",
                partitions=[
                    topic.DeleteRecordsPartition(partition_index=p, offset=2) for p in (0, 1)
                ],
            )
        ],
        timeout_ms=10_000,
    )
    with RawConnection(cluster.brokers[0].bootstrap) as conn:
        answer = conn.call(request, DeleteRecordsResponse)
        got = {
            p.partition_index: (p.error_code, p.low_watermark) for p in answer.topics[0].partitions
        }
        assert got == {mine: (0, 2), other: (6, -1)}  # NOT_LEADER_OR_FOLLOWER
        answer = conn.call(request, DeleteRecordsResponse)  # the connection serves on
        assert answer.topics[0].partitions[0].partition_index == 0
    admin = cluster.admin(0)  # (kept: its futures complete only while it lives)
    trimmed = admin.delete_records([TopicPartition("trim", p, 3) for p in (0, 1)])
    for future in trimmed.values():
        assert future.result(timeout=30).low_watermark == 3


def test_a_partition_led_elsewhere_names_its_leader(cluster_factory: ClusterFactory) -> None:
    """KIP-951, as Kafka answers it: Fetch v16+ and Produce v10+ sent to a broker that does
    not lead the partition (a client's stale metadata, a partition just moved) answer
    NOT_LEADER_OR_FOLLOWER with the partition's leader and leader epoch, and the leader's
    address, so the client goes there without a Metadata round trip first. Older versions
    name none."""
    import uuid

    from kafka.protocol.consumer.fetch import FetchResponse
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse
    from kafka.protocol.producer import ProduceResponse

    from protocol.records import RecordInput, build_batch
    from tests.support.raw_connection import (
        RawConnection,
        fetch_request,
        partition_produce_request,
    )

    cluster = cluster_factory(brokers=2)
    _create(cluster.admin(0), "hint", 2)
    leaders = cluster.leaders("hint")
    assert sorted(leaders.values()) == [0, 1]
    other = next(p for p, leader in leaders.items() if leader == 1)
    elsewhere = cluster.brokers[1].bootstrap.rsplit(":", 1)
    with RawConnection(cluster.brokers[0].bootstrap) as conn:
        metadata = conn.call(
            MetadataRequest[12](
                topics=[MetadataRequest.MetadataRequestTopic(name="hint", topic_id=None)],
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            ),
            MetadataResponse,
        )
        [topic] = metadata.topics
        epoch = next(p.leader_epoch for p in topic.partitions if p.partition_index == other)
        topic_id = uuid.UUID(str(topic.topic_id))

        def fetch(version: int) -> Any:
            request = fetch_request(
                topic_id, {other: 0}, max_wait_ms=0, min_bytes=0, version=version
            )
            return conn.call(request, FetchResponse)

        def produce(version: int) -> Any:
            records = bytes(build_batch([RecordInput(b"v")]))
            request = partition_produce_request("hint", other, records, version=version)
            return conn.call(request, ProduceResponse)

        for answer, p in [
            (a := fetch(16), a.responses[0].partitions[0]),
            (a := produce(10), a.responses[0].partition_responses[0]),
        ]:
            assert p.error_code == 6  # NOT_LEADER_OR_FOLLOWER
            leader = p.current_leader
            assert (leader.leader_id, leader.leader_epoch) == (1, epoch)
            assert [(e.node_id, e.host, e.port) for e in answer.node_endpoints] == [
                (1, elsewhere[0], int(elsewhere[1]))
            ]
        older = fetch(15).responses[0].partitions[0]
        assert (older.error_code, older.current_leader) == (6, None)
        assert produce(9).responses[0].partition_responses[0].error_code == 6


def test_a_manual_assignment_decides_the_leaders(cluster_factory: ClusterFactory) -> None:
    """As Kafka's controller: each partition of a manual replica assignment (CreateTopics,
    CreatePartitions) is led by the first live broker of its list."""
    from confluent_kafka.admin import NewPartitions

    cluster = cluster_factory(brokers=2)
    admin = cluster.admin(0)
    # all on broker 1 (placement would spread them), the last listing broker 0 after it
    created = admin.create_topics([NewTopic("pinned", 3, replica_assignment=[[1], [1], [1, 0]])])
    created["pinned"].result(timeout=30)
    assert cluster.leaders("pinned") == {0: 1, 1: 1, 2: 1}
    grown = admin.create_partitions([NewPartitions("pinned", 5, replica_assignment=[[0], [0]])])
    grown["pinned"].result(timeout=30)
    deadline = time.monotonic() + 10
    while len(leaders := cluster.leaders("pinned")) < 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leaders == {0: 1, 1: 1, 2: 1, 3: 0, 4: 0}
