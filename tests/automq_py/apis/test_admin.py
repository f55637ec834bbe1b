"""The admin APIs through confluent-kafka's AdminClient, against the real broker on real S3:
configs, partitions, the cluster, record deletion and offsets by timestamp. The tests share one
broker, each with its own topics; none changes the broker's own configs."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)
from kafka.admin import KafkaAdminClient
from kafka.errors import InvalidUpdateVersionError
from kafka.protocol.admin import (
    DescribeClusterRequest,
    DescribeClusterResponse,
    UpdateFeaturesRequest,
    UpdateFeaturesResponse,
)

from protocol.errors import ErrorCode
from tests.automq_py.conftest import module_broker
from tests.support.broker import BrokerProcess
from tests.support.raw_connection import RawConnection
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

TIMEOUT = 15


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    with module_broker(tmp_path_factory, s3_server) as b:
        yield b


def admin_for(b: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.bootstrap})


def create_topics(admin: AdminClient, *topics: NewTopic) -> None:
    for future in admin.create_topics(list(topics)).values():
        future.result(TIMEOUT)


def topic_configs(admin: AdminClient, topic: str) -> dict[str, Any]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return dict(admin.describe_configs([resource])[resource].result(TIMEOUT))


def kafka_error(future: Any) -> KafkaError:
    with pytest.raises(KafkaException) as raised:
        future.result(TIMEOUT)
    error = raised.value.args[0]
    assert isinstance(error, KafkaError)
    return error


def produce(
    bootstrap: str, topic: str, values: list[bytes], partition: int = 0, **config: Any
) -> list[int]:
    """Produce ``values`` to one partition, waiting for each delivery; their offsets."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **config})
    offsets: list[int] = []
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            offsets.append(msg.offset())

    for value in values:
        producer.produce(topic, value, partition=partition, on_delivery=delivered)
    assert producer.flush(TIMEOUT) == 0
    if errors:
        raise KafkaException(errors[0])
    return offsets


def test_describe_topic_configs_with_sources(broker: BrokerProcess) -> None:
    admin = admin_for(broker)
    create_topics(admin, NewTopic("described", 1, 1, config={"retention.ms": "3600000"}))
    configs = topic_configs(admin, "described")

    retention = configs["retention.ms"]
    assert retention.value == "3600000"
    assert retention.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert not retention.is_read_only and not retention.is_sensitive
    # the topic's own value first, then the broker default it overrides: none named
    # log.retention.ms here (Kafka lists a synonym chain from its first name on)
    assert [(s.name, s.source) for s in retention.synonyms.values()] == [
        ("retention.ms", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
    ]
    assert [(s.name, s.source) for s in configs["segment.bytes"].synonyms.values()] == [
        ("log.segment.bytes", ConfigSource.DEFAULT_CONFIG.value),
    ]
    inherited = configs["max.message.bytes"]
    assert inherited.value == "1048588"
    assert inherited.source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["cleanup.policy"].value == "delete"
    assert {"segment.bytes", "segment.ms", "message.timestamp.type"} <= set(configs)


def test_describe_configs_of_an_unknown_topic(broker: BrokerProcess) -> None:
    admin = admin_for(broker)
    missing = ConfigResource(ResourceType.TOPIC, "no-such-topic")
    error = kafka_error(admin.describe_configs([missing])[missing])
    assert error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_describe_broker_configs_redacts_secrets(
    s3_server: SeaweedFS,
    broker: BrokerProcess,
) -> None:
    admin = admin_for(broker)
    resource = ConfigResource(ResourceType.BROKER, "0")
    configs = admin.describe_configs([resource])[resource].result(TIMEOUT)

    assert configs["message.max.bytes"].value == "1048588"
    assert configs["message.max.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["listeners"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    # read-only unless it can change dynamically, as Kafka marks them
    assert configs["listeners"].is_read_only
    assert configs["log.retention.hours"].is_read_only
    assert not configs["log.retention.ms"].is_read_only
    assert not configs["message.max.bytes"].is_read_only
    assert configs["log.retention.ms"].value is None  # unset: log.retention.hours decides
    buckets = configs["s3.data.buckets"]
    # it holds the secret key: sensitive, its value never sent, as Kafka does for passwords
    assert buckets.is_sensitive
    assert buckets.value is None


# AlterConfigs (33) is what this test is about, deprecated in clients or not
@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")
def test_alter_configs_replaces_the_topic_configs(broker: BrokerProcess) -> None:
    admin = admin_for(broker)
    create_topics(admin, NewTopic("altered", 1, 1, config={"retention.ms": "3600000"}))
    resource = ConfigResource(ResourceType.TOPIC, "altered", set_config={"segment.ms": "60000"})
    admin.alter_configs([resource])[resource].result(TIMEOUT)

    configs = topic_configs(admin, "altered")
    assert configs["segment.ms"].value == "60000"
    assert configs["segment.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    # left out of the new set: back to the broker default
    assert configs["retention.ms"].value == str(7 * 24 * 3600 * 1000)
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value

    bad = ConfigResource(ResourceType.TOPIC, "altered", set_config={"segment.ms": "soon"})
    error = kafka_error(admin.alter_configs([bad])[bad])
    assert error.code() == KafkaError.INVALID_CONFIG
    assert "segment.ms" in error.str()
    assert topic_configs(admin, "altered")["segment.ms"].value == "60000"

    static = ConfigResource(ResourceType.BROKER, "0", set_config={"num.partitions": "4"})
    error = kafka_error(admin.alter_configs([static])[static])
    assert error.code() == KafkaError.INVALID_REQUEST
    assert "num.partitions" in error.str()


def test_incremental_alter_configs(broker: BrokerProcess) -> None:
    admin = admin_for(broker)
    create_topics(admin, NewTopic("incremental", 1, 1, config={"retention.ms": "3600000"}))
    # open the partition first: the new max.message.bytes must reach it
    produce(broker.bootstrap, "incremental", [b"small"])

    def alter(*entries: ConfigEntry, validate_only: bool = False) -> Any:
        resource = ConfigResource(ResourceType.TOPIC, "incremental", incremental_configs=entries)
        future = admin.incremental_alter_configs([resource], validate_only=validate_only)
        return future[resource]

    alter(
        ConfigEntry("max.message.bytes", "2000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
    ).result(TIMEOUT)
    configs = topic_configs(admin, "incremental")
    assert configs["max.message.bytes"].value == "2000"
    assert configs["max.message.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["cleanup.policy"].value == "delete,compact"
    assert configs["retention.ms"].value == "3600000"  # untouched
    with pytest.raises(KafkaException) as raised:
        produce(broker.bootstrap, "incremental", [b"x" * 5000])
    assert raised.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE

    alter(
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
    ).result(TIMEOUT)
    configs = topic_configs(admin, "incremental")
    assert configs["cleanup.policy"].value == "compact"
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value

    alter(
        ConfigEntry("segment.bytes", "100000", incremental_operation=AlterConfigOpType.SET),
        validate_only=True,
    ).result(TIMEOUT)
    assert topic_configs(admin, "incremental")["segment.bytes"].value == str(1 << 30)

    error = kafka_error(
        alter(ConfigEntry("segment.bytes", "-5", incremental_operation=AlterConfigOpType.SET))
    )
    assert error.code() == KafkaError.INVALID_CONFIG
    assert "segment.bytes" in error.str()


def test_create_partitions(broker: BrokerProcess) -> None:
    admin = admin_for(broker)
    create_topics(admin, NewTopic("growing", 3, 1))
    checked = admin.create_partitions([NewPartitions("growing", 5)], validate_only=True)
    checked["growing"].result(TIMEOUT)
    assert len(admin.list_topics("growing").topics["growing"].partitions) == 3

    admin.create_partitions([NewPartitions("growing", 6)])["growing"].result(TIMEOUT)
    assert len(admin.list_topics("growing").topics["growing"].partitions) == 6
    assert produce(broker.bootstrap, "growing", [b"on the new partition"], partition=5) == [0]

    error = kafka_error(admin.create_partitions([NewPartitions("growing", 4)])["growing"])
    assert error.code() == KafkaError.INVALID_PARTITIONS
    error = kafka_error(
        admin.create_partitions([NewPartitions("no-such-topic", 4)])["no-such-topic"]
    )
    assert error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_describe_cluster(broker: BrokerProcess) -> None:
    admin = admin_for(broker)  # kept: a collected client cancels its requests
    cluster = admin.describe_cluster().result(TIMEOUT)
    assert cluster.cluster_id == broker.overrides["cluster.id"]
    assert cluster.controller.id == 0
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(0, "127.0.0.1", broker.port)]


def test_describe_cluster_of_another_endpoint_type_is_refused_in_kafka_s_words(
    broker: BrokerProcess,
) -> None:
    """AuthHelper.computeDescribeClusterResponse: a broker asked for controller endpoints (a
    client's bootstrap.controllers pointed at it) answers MISMATCHED_ENDPOINT_TYPE, a type it
    does not know UNSUPPORTED_ENDPOINT_TYPE; the error alone, nothing else described."""
    with RawConnection(broker.bootstrap) as conn:
        controllers = conn.call(
            DescribeClusterRequest[1](include_cluster_authorized_operations=False, endpoint_type=2),
            DescribeClusterResponse,
        )
        unknown = conn.call(
            DescribeClusterRequest[1](include_cluster_authorized_operations=False, endpoint_type=9),
            DescribeClusterResponse,
        )
    assert (controllers.error_code, controllers.error_message) == (
        ErrorCode.MISMATCHED_ENDPOINT_TYPE,
        "The request was sent to an endpoint of type BROKER, but we wanted an endpoint of type "
        "CONTROLLER",
    )
    assert (controllers.cluster_id, controllers.controller_id, controllers.brokers) == ("", -1, [])
    assert (unknown.error_code, unknown.error_message) == (
        ErrorCode.UNSUPPORTED_ENDPOINT_TYPE,
        "Unsupported endpoint type 9",
    )


def test_delete_records_moves_the_log_start(broker: BrokerProcess) -> None:
    admin = admin_for(broker)
    create_topics(admin, NewTopic("trimmed", 2, 1))
    produce(broker.bootstrap, "trimmed", [f"r{i}".encode() for i in range(10)])
    produce(broker.bootstrap, "trimmed", [b"a", b"b"], partition=1)

    done = admin.delete_records([TopicPartition("trimmed", 0, 4)])
    assert next(iter(done.values())).result(TIMEOUT).low_watermark == 4
    # -1: up to the high watermark
    done = admin.delete_records([TopicPartition("trimmed", 1, -1)])
    assert next(iter(done.values())).result(TIMEOUT).low_watermark == 2
    beyond = admin.delete_records([TopicPartition("trimmed", 0, 11)])
    assert kafka_error(next(iter(beyond.values()))).code() == KafkaError.OFFSET_OUT_OF_RANGE

    earliest = admin.list_offsets({TopicPartition("trimmed", 0): OffsetSpec.earliest()})
    assert next(iter(earliest.values())).result(TIMEOUT).offset == 4

    # offset 0 is gone: the consumer hears OFFSET_OUT_OF_RANGE and resets to the new start
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "trimmed-reader",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition("trimmed", 0, 0)])
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 30
    while len(got) < 6 and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            got.append((msg.offset(), msg.value()))
    consumer.close()
    assert got == [(i, f"r{i}".encode()) for i in range(4, 10)]


def test_delete_topics(broker: BrokerProcess) -> None:
    admin = admin_for(broker)
    create_topics(admin, NewTopic("doomed", 1, 1))
    admin.delete_topics(["doomed"])["doomed"].result(TIMEOUT)
    assert "doomed" not in admin.list_topics(timeout=TIMEOUT).topics
    resource = ConfigResource(ResourceType.TOPIC, "doomed")
    error = kafka_error(admin.describe_configs([resource])[resource])
    assert error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_list_offsets_by_timestamp(broker: BrokerProcess, compression: str) -> None:
    admin = admin_for(broker)
    topic = f"timed-{compression}"
    create_topics(admin, NewTopic(topic, 1, 1))
    base = int(time.time() * 1000) - 60_000
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "linger.ms": 1000, "compression.type": compression}
    )
    # four batches of five records (one flush each); record i has timestamp base + 10 * i
    for batch in range(4):
        for i in range(batch * 5, batch * 5 + 5):
            producer.produce(topic, f"v{i}".encode(), partition=0, timestamp=base + 10 * i)
        assert producer.flush(TIMEOUT) == 0

    def lookup(timestamp: int) -> tuple[int, int]:
        tp = TopicPartition(topic, 0)
        found = admin.list_offsets({tp: OffsetSpec.for_timestamp(timestamp)})[tp].result(TIMEOUT)
        return found.offset, found.timestamp

    assert lookup(base - 1000) == (0, base)
    assert lookup(base + 10 * 7 - 5) == (7, base + 70)  # inside the second batch
    assert lookup(base + 10 * 12) == (12, base + 120)  # equal to a record's timestamp
    assert lookup(base + 10 * 15) == (15, base + 150)  # a batch's first record
    assert lookup(base + 10 * 19) == (19, base + 190)  # the last record
    assert lookup(base + 10 * 19 + 1) == (-1, -1)  # after the last

    # records below the log start do not count
    done = admin.delete_records([TopicPartition(topic, 0, 8)])
    next(iter(done.values())).result(TIMEOUT)
    assert lookup(base + 10 * 6) == (8, base + 80)


# -- the handlers' rules with no broker: what a client cannot be made to send ----------------


def fake_context(configs: dict[str, str] | None = None) -> Any:
    """A BrokerContext with node id 0, one topic ``t`` and no storage."""
    from automq_py.apis.context import BrokerContext
    from automq_py.config import BrokerConfig
    from automq_py.topics import TopicInfo

    topic = TopicInfo("t", uuid.uuid4(), 1, configs or {})
    config = BrokerConfig.from_properties({"log.retention.hours": "24"})
    return BrokerContext(
        node_id=0,
        cluster_id="c",
        host="127.0.0.1",
        port=9092,
        topics=SimpleNamespace(get=lambda name: topic if name == "t" else None),
        replicas=SimpleNamespace(topic_defaults=config.topic_defaults()),
        auto_create_topics=True,
        num_partitions=1,
        config=config,
    )


def test_describe_another_broker_is_an_invalid_request() -> None:
    from automq_py.apis.configs import ConfigRequestError, describe_broker

    ctx = fake_context()
    with pytest.raises(ConfigRequestError) as raised:
        describe_broker(ctx, "7", synonyms=False, documentation=False)
    assert raised.value.code == ErrorCode.INVALID_REQUEST
    assert describe_broker(ctx, "", synonyms=False, documentation=False) == []
    by_name = {c["name"]: c for c in describe_broker(ctx, "0", synonyms=True, documentation=True)}
    assert by_name["log.retention.hours"]["config_source"] == 4
    assert by_name["node.id"]["documentation"] == "this broker's node id"


def test_static_broker_default_is_the_source_of_an_inherited_topic_config() -> None:
    from automq_py.apis.configs import describe_topic
    from automq_py.config import BrokerConfig

    ctx = fake_context()
    by_name = {
        c["name"]: c
        for c in describe_topic(ctx, ctx.topics.get("t"), synonyms=True, documentation=False)
    }
    retention = by_name["retention.ms"]
    assert retention["value"] == str(24 * 3600 * 1000)
    # Kafka's quirk: set as log.retention.hours, retention.ms reads DEFAULT_CONFIG
    assert retention["config_source"] == 5
    assert retention["synonyms"] == []
    # set as the first synonym, the broker setting is the source
    ctx.config = BrokerConfig.from_properties({"log.retention.ms": "60000"})
    by_name = {
        c["name"]: c
        for c in describe_topic(ctx, ctx.topics.get("t"), synonyms=True, documentation=False)
    }
    assert by_name["retention.ms"]["config_source"] == 4
    assert [(s["name"], s["value"], s["source"]) for s in by_name["retention.ms"]["synonyms"]] == [
        ("log.retention.ms", "60000", 4),
        ("log.retention.hours", "168", 5),
    ]


def test_incremental_operations() -> None:
    from automq_py.apis.configs import ConfigRequestError, incremental_configs

    current = {"cleanup.policy": "compact", "retention.ms": "5"}

    def apply(*ops: Any) -> dict[str, str]:
        return incremental_configs(
            current, ops, lambda name: "delete", lambda name: name == "cleanup.policy"
        )

    def op(name: str, value: str | None, kind: int) -> Any:
        return SimpleNamespace(name=name, value=value, config_operation=kind)

    assert apply(op("cleanup.policy", "delete,compact", 2), op("retention.ms", None, 1)) == {
        "cleanup.policy": "compact,delete"
    }
    assert apply(op("cleanup.policy", "compact", 3)) == {"cleanup.policy": "", "retention.ms": "5"}
    # a list the resource does not set starts from what it inherits
    assert incremental_configs(
        {}, [op("cleanup.policy", "compact", 2)], lambda name: "delete", lambda name: True
    ) == {"cleanup.policy": "delete,compact"}
    # each item once, as Kafka's controller appends them
    assert apply(op("cleanup.policy", "delete,delete,compact", 2))["cleanup.policy"] == (
        "compact,delete"
    )
    # an own empty list is the resource's: nothing inherited
    assert incremental_configs(
        {"cleanup.policy": ""}, [op("cleanup.policy", "compact", 2)], lambda n: "delete", bool
    ) == {"cleanup.policy": "compact"}
    with pytest.raises(ConfigRequestError) as raised:
        apply(op("retention.ms", "1", 2))
    assert raised.value.code == ErrorCode.INVALID_CONFIG
    assert str(raised.value) == "Can't APPEND to key retention.ms because its type is not LIST."


@pytest.mark.parametrize("version", [0, 1])
def test_update_features_changes_nothing_and_refuses_what_kafka_refuses(
    broker: BrokerProcess, version: int
) -> None:
    """UpdateFeatures: the levels in force are the highest served, so asking for them succeeds
    and changes nothing; an unknown feature, a level out of range and a downgrade fail the
    whole request with INVALID_UPDATE_VERSION and Kafka's message."""
    f = UpdateFeaturesRequest.FeatureUpdateKey

    def update(*updates: tuple[str, int, int]) -> Any:
        keys = [
            f(feature=n, max_version_level=v, allow_downgrade=t != 1, upgrade_type=t)
            for n, v, t in updates
        ]
        extra = {"validate_only": False} if version else {}
        request = UpdateFeaturesRequest[version](timeout_ms=5000, feature_updates=keys, **extra)
        conn = RawConnection(broker.bootstrap)
        try:
            return conn.call(request, UpdateFeaturesResponse)
        finally:
            conn.close()

    same = update(("metadata.version", 21, 1), ("group.version", 1, 1))
    assert same.error_code == ErrorCode.NONE
    assert sorted((r.feature, r.error_code) for r in same.results) == [
        ("group.version", 0),
        ("metadata.version", 0),
    ]
    unknown = update(("group.version", 1, 1), ("sarama.unsupported.feature", 1, 1))
    assert (unknown.error_code, unknown.results) == (ErrorCode.INVALID_UPDATE_VERSION, [])
    assert unknown.error_message.endswith(
        "Invalid update version 1 for feature sarama.unsupported.feature. Local controller 0 "
        "does not support this feature."
    )
    above = update(("metadata.version", 22, 1))
    assert above.error_code == ErrorCode.INVALID_UPDATE_VERSION
    assert above.error_message.endswith(
        "Invalid update version 22 for feature metadata.version. Local controller 0 only "
        "supports versions 7-21"
    )
    downgrade_as_upgrade = update(("group.version", 0, 1))
    assert "without setting the upgrade type" in downgrade_as_upgrade.error_message
    downgrade = update(("group.version", 0, 2))
    assert downgrade.error_code == ErrorCode.INVALID_UPDATE_VERSION
    assert "group.version at level 1 only" in downgrade.error_message
    metadata = update(("metadata.version", 20, 2))
    assert metadata.error_message == (
        "The update failed for all features since the following feature had an error: Invalid "
        "metadata.version 20. Refusing to perform the requested downgrade because it might "
        "delete metadata information."
    )
    # kafka-python's admin client: the same, and the levels in force unchanged
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        assert admin.update_features({"group.version": 1}) == {"group.version": "OK"}
        with pytest.raises(InvalidUpdateVersionError):
            admin.update_features({"group.version": ("SAFE_DOWNGRADE", 0)})
        described = admin.describe_features()
    finally:
        admin.close()
    assert described["metadata.version"]["finalized"] == (21, 21)
    assert described["group.version"]["finalized"] == (1, 1)
