"""Consumer groups through confluent-kafka's AdminClient, against the real broker on real S3:
listing (state and type filters), describing, deleting groups, listing, altering, resetting
and deleting committed offsets, and the metadata strings committed with them.

Groups are made by real consumers: librdkafka's classic protocol (JoinGroup/SyncGroup) and
its KIP-848 protocol (``group.protocol=consumer``, ConsumerGroupHeartbeat). confluent-kafka's
AdminClient has no OffsetDelete; kafka-python 3's ``KafkaAdminClient.delete_group_offsets``
sends it instead.

The tests share one broker, each with its own topics and groups; the ones that list every group
or restart the broker start their own.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    ConsumerGroupType,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec, ResourceType
from kafka import KafkaAdminClient  # type: ignore[import-untyped]
from kafka import TopicPartition as KafkaPythonTopicPartition
from kafka.errors import (  # type: ignore[import-untyped]
    GroupIdNotFoundError,
    GroupSubscribedToTopicError,
    NoError,
    UnknownTopicOrPartitionError,
)

from tests.automq_py.conftest import MakeBroker, module_broker
from tests.support.broker import BrokerProcess
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

TIMEOUT = 15
# librdkafka's protocol names: "classic" is JoinGroup/SyncGroup, "consumer" is KIP-848
PROTOCOLS = ["classic", "consumer"]
# new groups rebalance at once (no initial rebalance delay)
NO_DELAY = {"group.initial.rebalance.delay.ms": "0"}


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    """The module's broker."""
    with module_broker(tmp_path_factory, s3_server, **NO_DELAY) as b:
        yield b


@pytest.fixture
def own_broker(make_broker: MakeBroker) -> BrokerProcess:
    """A fresh broker, for a test that lists every group or restarts it."""
    return make_broker(**NO_DELAY)


def admin_for(b: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.bootstrap})


def create_topic(admin: AdminClient, name: str, partitions: int) -> None:
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(TIMEOUT)


def produce(b: BrokerProcess, topic: str, per_partition: int, partitions: int = 1) -> None:
    """``per_partition`` records ``p<partition>-<i>`` into each partition."""
    producer = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    for p in range(partitions):
        for i in range(per_partition):
            producer.produce(topic, f"p{p}-{i}".encode(), partition=p)
    assert producer.flush(TIMEOUT) == 0


def consumer_for(
    b: BrokerProcess, group: str, protocol: str = "classic", **config: Any
) -> Consumer:
    settings: dict[str, Any] = {
        "bootstrap.servers": b.bootstrap,
        "group.id": group,
        "group.protocol": protocol,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        **config,
    }
    if protocol == "classic":
        settings.setdefault("session.timeout.ms", 10_000)
    return Consumer(settings)


def wait_for_assignments(
    consumers: Iterable[Consumer], partitions: int, timeout: float = 30
) -> list[set[int]]:
    """Poll ``consumers`` until their assignments split ``partitions`` partitions between
    them (every one has some); the partition numbers each one holds."""
    consumers = list(consumers)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in consumers:
            msg = c.poll(0.1)
            assert msg is None or msg.error() is None, msg.error()
        held = [{tp.partition for tp in c.assignment()} for c in consumers]
        if all(held) and sorted(p for h in held for p in h) == list(range(partitions)):
            return held
    raise AssertionError(f"no full assignment within {timeout}s: {held}")


def read_from(consumer: Consumer, count: int, timeout: float = 30) -> list[tuple[int, int]]:
    """The (partition, offset) of the first ``count`` records ``consumer`` polls."""
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None:
            assert msg.error() is None, msg.error()
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None
            got.append((partition, offset))
    return got


def committed(admin: AdminClient, group: str, *partitions: TopicPartition) -> dict[Any, Any]:
    """(topic, partition) -> (offset, metadata) as OffsetFetch answers for ``group``
    (librdkafka gives empty metadata as None)."""
    request = ConsumerGroupTopicPartitions(group, list(partitions) or None)
    found = admin.list_consumer_group_offsets([request])[group].result(TIMEOUT)
    assert found.group_id == group
    out = {}
    for tp in found.topic_partitions:
        assert tp.error is None, tp.error
        out[(tp.topic, tp.partition)] = (tp.offset, tp.metadata or "")
    return out


def alter(admin: AdminClient, group: str, *partitions: TopicPartition) -> list[TopicPartition]:
    request = ConsumerGroupTopicPartitions(group, list(partitions))
    done = admin.alter_consumer_group_offsets([request])[group].result(TIMEOUT)
    return list(done.topic_partitions)


def kafka_error(future: Any) -> KafkaError:
    with pytest.raises(KafkaException) as raised:
        future.result(TIMEOUT)
    error = raised.value.args[0]
    assert isinstance(error, KafkaError)
    return error


def listed(admin: AdminClient, **filters: Any) -> dict[str, Any]:
    result = admin.list_consumer_groups(request_timeout=TIMEOUT, **filters).result(TIMEOUT)
    assert result.errors == []
    return {g.group_id: g for g in result.valid}


def describe_when_stable(admin: AdminClient, group: str, timeout: float = 15) -> Any:
    """DescribeGroups until ``group`` is Stable: a member may hold its partitions a heartbeat
    before the coordinator hears that it does."""
    deadline = time.monotonic() + timeout
    while True:
        description = admin.describe_consumer_groups([group])[group].result(TIMEOUT)
        if description.state == ConsumerGroupState.STABLE or time.monotonic() > deadline:
            return description
        time.sleep(0.1)


def test_list_consumer_groups_by_state_and_type(own_broker: BrokerProcess) -> None:
    broker = own_broker
    admin = admin_for(broker)
    create_topic(admin, "listed", 2)
    produce(broker, "listed", 3, partitions=2)
    classic = consumer_for(broker, "classic-live")
    classic.subscribe(["listed"])
    modern = consumer_for(broker, "consumer-live", "consumer")
    modern.subscribe(["listed"])
    wait_for_assignments([classic], 2)
    wait_for_assignments([modern], 2)
    # commits with no membership: a "simple" group, empty and without a protocol type
    simple = consumer_for(broker, "committed-only")
    simple.commit(offsets=[TopicPartition("listed", 0, 1)], asynchronous=False)
    simple.close()

    everything = listed(admin)
    assert set(everything) == {"classic-live", "consumer-live", "committed-only"}
    summary = {
        g.group_id: (g.state, g.type, g.is_simple_consumer_group) for g in everything.values()
    }
    assert summary == {
        "classic-live": (ConsumerGroupState.STABLE, ConsumerGroupType.CLASSIC, False),
        "consumer-live": (ConsumerGroupState.STABLE, ConsumerGroupType.CONSUMER, False),
        "committed-only": (ConsumerGroupState.EMPTY, ConsumerGroupType.CLASSIC, True),
    }
    assert set(listed(admin, states={ConsumerGroupState.STABLE})) == {
        "classic-live",
        "consumer-live",
    }
    assert set(listed(admin, states={ConsumerGroupState.EMPTY})) == {"committed-only"}
    assert set(listed(admin, states={ConsumerGroupState.PREPARING_REBALANCING})) == set()
    assert set(listed(admin, types={ConsumerGroupType.CONSUMER})) == {"consumer-live"}
    assert set(listed(admin, types={ConsumerGroupType.CLASSIC})) == {
        "classic-live",
        "committed-only",
    }
    both = listed(admin, states={ConsumerGroupState.STABLE}, types={ConsumerGroupType.CLASSIC})
    assert set(both) == {"classic-live"}

    classic.close()
    modern.close()
    assert set(listed(admin, states={ConsumerGroupState.EMPTY})) == set(everything)


def test_describe_a_classic_group(broker: BrokerProcess) -> None:
    admin = admin_for(broker)
    create_topic(admin, "described-classic", 4)
    members = [
        consumer_for(
            broker,
            "describers",
            **{"client.id": f"client-{n}", "partition.assignment.strategy": "roundrobin"},
        )
        for n in range(2)
    ]
    for m in members:
        m.subscribe(["described-classic"])
    held = wait_for_assignments(members, 4)

    description = describe_when_stable(admin, "describers")
    assert description.group_id == "describers"
    assert description.state == ConsumerGroupState.STABLE
    assert description.type == ConsumerGroupType.CLASSIC
    assert description.partition_assignor == "roundrobin"
    assert not description.is_simple_consumer_group
    coordinator = description.coordinator
    assert (coordinator.id, coordinator.host, coordinator.port) == (0, "127.0.0.1", broker.port)
    by_client = {m.client_id: m for m in description.members}
    assert set(by_client) == {"client-0", "client-1"}
    for n, consumer in enumerate(members):
        member = by_client[f"client-{n}"]
        assert member.member_id == consumer.memberid()
        assert member.host == "/127.0.0.1"
        assert member.group_instance_id is None
        assert {(tp.topic, tp.partition) for tp in member.assignment.topic_partitions} == {
            ("described-classic", p) for p in held[n]
        }
    for m in members:
        m.close()

    empty = admin.describe_consumer_groups(["describers"])["describers"].result(TIMEOUT)
    assert empty.state == ConsumerGroupState.EMPTY
    assert empty.members == []
    # Kafka describes a group it does not know as a dead one, with no error
    unknown = admin.describe_consumer_groups(["nobody"])["nobody"].result(TIMEOUT)
    assert unknown.state == ConsumerGroupState.DEAD
    assert unknown.members == []


def test_describe_a_consumer_protocol_group(broker: BrokerProcess) -> None:
    admin = admin_for(broker)
    create_topic(admin, "described-consumer", 4)
    members = [
        consumer_for(
            broker,
            "modern",
            "consumer",
            **{"client.id": f"client-{n}", "group.remote.assignor": "range"},
        )
        for n in range(2)
    ]
    for m in members:
        m.subscribe(["described-consumer"])
    held = wait_for_assignments(members, 4)

    description = describe_when_stable(admin, "modern")
    assert description.state == ConsumerGroupState.STABLE
    assert description.type == ConsumerGroupType.CONSUMER
    assert description.partition_assignor == "range"
    assert description.coordinator.id == 0
    by_client = {m.client_id: m for m in description.members}
    assert set(by_client) == {"client-0", "client-1"}
    for n, consumer in enumerate(members):
        member = by_client[f"client-{n}"]
        assert member.member_id == consumer.memberid()
        assert member.host == "/127.0.0.1"
        expected = {("described-consumer", p) for p in held[n]}
        assert {(tp.topic, tp.partition) for tp in member.assignment.topic_partitions} == expected
        assert member.target_assignment is not None
        target = member.target_assignment.topic_partitions
        assert {(tp.topic, tp.partition) for tp in target} == expected
    for m in members:
        m.close()


def test_delete_consumer_groups(own_broker: BrokerProcess) -> None:
    broker = own_broker
    admin = admin_for(broker)
    create_topic(admin, "deleted", 2)
    produce(broker, "deleted", 4, partitions=2)
    finished = consumer_for(broker, "finished")
    finished.subscribe(["deleted"])
    wait_for_assignments([finished], 2)
    finished.commit(
        offsets=[TopicPartition("deleted", 0, 3), TopicPartition("deleted", 1, 2)],
        asynchronous=False,
    )
    finished.close()
    busy = consumer_for(broker, "busy")
    busy.subscribe(["deleted"])
    wait_for_assignments([busy], 2)
    busy.commit(offsets=[TopicPartition("deleted", 0, 1)], asynchronous=False)

    futures = admin.delete_consumer_groups(["finished", "busy", "never-was"])
    futures["finished"].result(TIMEOUT)
    assert kafka_error(futures["busy"]).code() == KafkaError.NON_EMPTY_GROUP
    assert kafka_error(futures["never-was"]).code() == KafkaError.GROUP_ID_NOT_FOUND

    assert set(listed(admin)) == {"busy"}
    assert committed(admin, "finished") == {}
    assert committed(admin, "finished", TopicPartition("deleted", 0)) == {
        ("deleted", 0): (OFFSET_INVALID, "")
    }
    assert committed(admin, "busy") == {("deleted", 0): (1, "")}
    # a new group of the same name starts from scratch: auto.offset.reset, not offset 3
    again = consumer_for(broker, "finished")
    again.assign([TopicPartition("deleted", 0)])
    assert read_from(again, 1) == [(0, 0)]
    again.close()

    busy.close()
    admin.delete_consumer_groups(["busy"])["busy"].result(TIMEOUT)
    assert listed(admin) == {}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_alter_offsets_of_an_empty_group(broker: BrokerProcess, protocol: str) -> None:
    admin = admin_for(broker)
    topic = group = f"altered-{protocol}"
    create_topic(admin, topic, 2)
    produce(broker, topic, 10, partitions=2)
    first = consumer_for(broker, group, protocol)
    first.subscribe([topic])
    wait_for_assignments([first], 2)
    first.commit(
        offsets=[TopicPartition(topic, 0, 2), TopicPartition(topic, 1, 2)],
        asynchronous=False,
    )
    # a group with a member refuses commits from outside it
    (refused,) = alter(admin, group, TopicPartition(topic, 0, 9))
    assert refused.error is not None and refused.error.code() == KafkaError.UNKNOWN_MEMBER_ID
    first.close()

    done = alter(admin, group, TopicPartition(topic, 0, 4), TopicPartition(topic, 1, 7))
    assert sorted((tp.partition, tp.offset, tp.error) for tp in done) == [
        (0, 4, None),
        (1, 7, None),
    ]
    assert committed(admin, group) == {(topic, 0): (4, ""), (topic, 1): (7, "")}

    second = consumer_for(broker, group, protocol)
    second.subscribe([topic])
    got = read_from(second, 9)
    second.close()
    assert sorted(got) == [(0, o) for o in range(4, 10)] + [(1, o) for o in range(7, 10)]


def test_reset_offsets_to_the_start_the_end_and_a_time(broker: BrokerProcess) -> None:
    """What ``kafka-consumer-groups --reset-offsets`` does: ListOffsets, then OffsetCommit."""
    admin = admin_for(broker)
    create_topic(admin, "reset", 1)
    base = int(time.time() * 1000) - 60_000
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(20):
        producer.produce("reset", f"r{i}".encode(), partition=0, timestamp=base + 10 * i)
    assert producer.flush(TIMEOUT) == 0
    trimmed = admin.delete_records([TopicPartition("reset", 0, 3)])
    next(iter(trimmed.values())).result(TIMEOUT)
    alter(admin, "resetters", TopicPartition("reset", 0, 10))
    tp = TopicPartition("reset", 0)

    def reset_to(spec: OffsetSpec) -> int:
        found = admin.list_offsets({tp: spec})[tp].result(TIMEOUT)
        (done,) = alter(admin, "resetters", TopicPartition("reset", 0, found.offset))
        assert done.error is None
        (offset, _), *_ = committed(admin, "resetters").values()
        return int(offset)

    assert reset_to(OffsetSpec.earliest()) == 3  # the log start, after DeleteRecords
    assert reset_to(OffsetSpec.latest()) == 20
    assert reset_to(OffsetSpec.for_timestamp(base + 10 * 12 - 3)) == 12

    reader = consumer_for(broker, "resetters")
    reader.subscribe(["reset"])
    assert read_from(reader, 8) == [(0, o) for o in range(12, 20)]
    reader.close()


def kafka_python_admin(b: BrokerProcess) -> Any:
    return KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=TIMEOUT * 1000)


def test_delete_offsets_of_an_empty_group(broker: BrokerProcess) -> None:
    admin = admin_for(broker)
    create_topic(admin, "kept", 2)
    create_topic(admin, "dropped", 1)
    alter(
        admin,
        "pruned",
        TopicPartition("kept", 0, 1),
        TopicPartition("kept", 1, 2),
        TopicPartition("dropped", 0, 3),
    )
    other = kafka_python_admin(broker)
    try:
        result = other.delete_group_offsets(
            "pruned",
            [KafkaPythonTopicPartition("dropped", 0), KafkaPythonTopicPartition("kept", 1)],
        )
        assert result == {
            KafkaPythonTopicPartition("dropped", 0): NoError,
            KafkaPythonTopicPartition("kept", 1): NoError,
        }
        assert committed(admin, "pruned") == {("kept", 0): (1, "")}
        # partitions the cluster does not have, as in Kafka
        absent = [KafkaPythonTopicPartition("absent", 0), KafkaPythonTopicPartition("kept", 5)]
        assert other.delete_group_offsets("pruned", absent) == dict.fromkeys(
            absent, UnknownTopicOrPartitionError
        )
        with pytest.raises(GroupIdNotFoundError):
            other.delete_group_offsets("never-was", [KafkaPythonTopicPartition("kept", 0)])
    finally:
        other.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_delete_offsets_of_a_subscribed_topic_is_refused(
    broker: BrokerProcess, protocol: str
) -> None:
    admin = admin_for(broker)
    subscribed, elsewhere = f"subscribed-{protocol}", f"elsewhere-{protocol}"
    create_topic(admin, subscribed, 1)
    create_topic(admin, elsewhere, 1)
    group = f"active-{protocol}"
    member = consumer_for(broker, group, protocol)
    member.subscribe([subscribed])
    wait_for_assignments([member], 1)
    member.commit(
        offsets=[TopicPartition(subscribed, 0, 5), TopicPartition(elsewhere, 0, 6)],
        asynchronous=False,
    )
    other = kafka_python_admin(broker)
    try:
        result = other.delete_group_offsets(
            group,
            [KafkaPythonTopicPartition(subscribed, 0), KafkaPythonTopicPartition(elsewhere, 0)],
        )
        assert result == {
            KafkaPythonTopicPartition(subscribed, 0): GroupSubscribedToTopicError,
            KafkaPythonTopicPartition(elsewhere, 0): NoError,
        }
        assert committed(admin, group) == {(subscribed, 0): (5, "")}
    finally:
        other.close()
        member.close()


def test_committed_metadata_strings_are_kept(own_broker: BrokerProcess) -> None:
    broker = own_broker
    admin = admin_for(broker)
    create_topic(admin, "annotated", 3)
    member = consumer_for(broker, "annotators")
    member.subscribe(["annotated"])
    wait_for_assignments([member], 3)
    notes = {0: "checkpoint 42", 1: "ünïcødé ✓ " + "x" * 1000, 2: ""}
    member.commit(
        offsets=[TopicPartition("annotated", p, 10 + p, metadata=m) for p, m in notes.items()],
        asynchronous=False,
    )
    seen = member.committed([TopicPartition("annotated", p) for p in notes], timeout=TIMEOUT)
    assert {tp.partition: (tp.offset, tp.metadata) for tp in seen} == {
        p: (10 + p, m) for p, m in notes.items()
    }
    member.close()
    expected = {("annotated", p): (10 + p, m) for p, m in notes.items()}
    assert committed(admin, "annotators") == expected

    # written to __consumer_offsets: a restarted broker reads them back
    broker.stop()
    broker.start()
    admin = admin_for(broker)
    deadline = time.monotonic() + 30
    while True:
        try:
            assert committed(admin, "annotators") == expected
            break
        except KafkaException as e:
            # librdkafka does not retry this one, Kafka's Java admin client does
            loading = e.args[0].code() == KafkaError.COORDINATOR_LOAD_IN_PROGRESS
            if not loading or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_offsets_of_unknown_topics_are_refused(broker: BrokerProcess) -> None:
    admin = admin_for(broker)
    create_topic(admin, "real", 1)
    request = ConsumerGroupTopicPartitions(
        "strays", [TopicPartition("real", 0, 1), TopicPartition("imaginary", 0, 1)]
    )
    done = admin.alter_consumer_group_offsets([request])["strays"].result(TIMEOUT)
    errors = {tp.topic: tp.error.code() if tp.error else None for tp in done.topic_partitions}
    assert errors == {"real": None, "imaginary": KafkaError.UNKNOWN_TOPIC_OR_PART}
    assert committed(admin, "strays", TopicPartition("real", 0)) == {("real", 0): (1, "")}


def test_metadata_auto_creates_the_internal_topics_as_their_coordinators_would(
    own_broker: BrokerProcess,
) -> None:
    """A Metadata request naming __consumer_offsets or __transaction_state before any group or
    transaction made them (a lag exporter, `kcat -L -t __consumer_offsets`) creates them as
    their coordinators do, as Kafka's AutoTopicCreationManager does: their partition counts,
    compacted. Groups then use that topic."""
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    from tests.support.raw_connection import RawConnection

    internal = ("__consumer_offsets", "__transaction_state")
    with RawConnection(own_broker.bootstrap) as conn:
        answer = conn.call(
            MetadataRequest[9](
                topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in internal],
                allow_auto_topic_creation=True,
            ),
            MetadataResponse,
        )
    assert [(t.name, t.error_code, t.is_internal) for t in answer.topics] == [
        (n, 5, True)
        for n in internal  # LEADER_NOT_AVAILABLE: created by this request
    ]
    admin = admin_for(own_broker)
    listed = admin.list_topics(timeout=TIMEOUT).topics
    assert {n: len(listed[n].partitions) for n in internal} == {n: 50 for n in internal}
    resources = [ConfigResource(ResourceType.TOPIC, n) for n in internal]
    for resource, future in admin.describe_configs(resources).items():
        assert future.result(TIMEOUT)["cleanup.policy"].value == "compact", resource
    create_topic(admin, "after-internal", 1)
    consumer = Consumer({"bootstrap.servers": own_broker.bootstrap, "group.id": "after"})
    try:
        consumer.commit(offsets=[TopicPartition("after-internal", 0, 0)], asynchronous=False)
    finally:
        consumer.close()
    assert committed(admin, "after", TopicPartition("after-internal", 0)) == {
        ("after-internal", 0): (0, "")
    }
