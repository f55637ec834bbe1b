"""Kafka 3.9's config surface through confluent-kafka's AdminClient, against the real broker:
every topic config Kafka 3.9 defines is accepted (deprecated ones included) and the ones that
act here act (LogAppendTime, the timestamp bounds, min.insync.replicas); broker resources
describe Kafka's read_only, config_source and synonyms, and the dynamic broker configs change
the topic defaults at once and survive a restart. The topic-config tests share one broker,
each with its own topics; the broker-config tests start their own."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)
from kafka.admin import ConfigResource as KafkaConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka.protocol.admin.configs import (
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.consumer.fetch import FetchResponse

from protocol import record_batch
from tests.automq_py.apis.test_admin import (
    TIMEOUT,
    admin_for,
    create_topics,
    kafka_error,
    topic_configs,
)
from tests.automq_py.conftest import MakeBroker, module_broker
from tests.support.broker import BrokerProcess, free_port
from tests.support.raw_connection import RawConnection, fetch_request
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    with module_broker(tmp_path_factory, s3_server) as b:
        yield b


# Every topic config of Kafka 3.9 (TopicConfig / LogConfig), each with a valid value other
# than its default.
KAFKA_39_TOPIC_CONFIGS = {
    "cleanup.policy": "compact,delete",
    "compression.type": "zstd",
    "compression.gzip.level": "5",
    "compression.lz4.level": "10",
    "compression.zstd.level": "-5",
    "delete.retention.ms": "1000",
    "file.delete.delay.ms": "1",
    "flush.messages": "10",
    "flush.ms": "100",
    "follower.replication.throttled.replicas": "0:0",
    "index.interval.bytes": "1024",
    "leader.replication.throttled.replicas": "*",
    "local.retention.bytes": "-1",
    "local.retention.ms": "1000",
    "max.compaction.lag.ms": "100000",
    "max.message.bytes": "2000000",
    "message.downconversion.enable": "false",
    "message.format.version": "2.8",
    "message.timestamp.after.max.ms": "3600000",
    "message.timestamp.before.max.ms": "3600000",
    "message.timestamp.difference.max.ms": "7200000",
    "message.timestamp.type": "LogAppendTime",
    "min.cleanable.dirty.ratio": "0.1",
    "min.compaction.lag.ms": "10",
    "min.insync.replicas": "1",
    "preallocate": "true",
    "remote.log.copy.disable": "true",
    "remote.log.delete.on.disable": "true",
    "remote.storage.enable": "false",
    "retention.bytes": "1000000",
    "retention.ms": "3600000",
    "segment.bytes": "1048576",
    "segment.index.bytes": "4096",
    "segment.jitter.ms": "5",
    "segment.ms": "600000",
    "unclean.leader.election.enable": "true",
}


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def deliver(broker: BrokerProcess, topic: str, timestamp: int = 0, **config: Any) -> Any:
    """Produce one record and wait for its delivery report: (error, message)."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, **config})
    reports: list[tuple[KafkaError | None, Any]] = []
    producer.produce(
        topic,
        b"v",
        key=b"k",
        partition=0,
        timestamp=timestamp,
        on_delivery=lambda err, msg: reports.append((err, msg)),
    )
    assert producer.flush(TIMEOUT) == 0
    return reports[0]


def consume_one(broker: BrokerProcess, topic: str) -> Any:
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": fresh("g"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                return msg
        raise AssertionError(f"nothing consumed from {topic}")
    finally:
        consumer.close()


def test_every_kafka_39_topic_config_is_accepted_and_described(broker: BrokerProcess) -> None:
    admin = admin_for(broker)
    created = fresh("all-configs")
    create_topics(admin, NewTopic(created, 1, 1, config=KAFKA_39_TOPIC_CONFIGS))
    described = topic_configs(admin, created)
    for name, value in KAFKA_39_TOPIC_CONFIGS.items():
        assert described[name].value == value, name
        assert described[name].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, name
    assert set(described) == set(KAFKA_39_TOPIC_CONFIGS)

    # the same set through IncrementalAlterConfigs on a topic created without configs
    altered = fresh("altered")
    create_topics(admin, NewTopic(altered, 1, 1))
    ops = [
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in KAFKA_39_TOPIC_CONFIGS.items()
    ]
    resource = ConfigResource(ResourceType.TOPIC, altered, incremental_configs=ops)
    admin.incremental_alter_configs([resource])[resource].result(TIMEOUT)
    described = topic_configs(admin, altered)
    assert {n: described[n].value for n in KAFKA_39_TOPIC_CONFIGS} == KAFKA_39_TOPIC_CONFIGS


@pytest.mark.parametrize(
    ("configs", "named"),
    [
        ({"remote.storage.enable": "true"}, "Tiered Storage functionality is disabled"),
        ({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"}, "min.compaction.lag.ms"),
        ({"compression.gzip.level": "10"}, "compression.gzip.level"),
        ({"leader.replication.throttled.replicas": "x"}, "leader.replication.throttled"),
        ({"message.format.version": "banana"}, "message.format.version"),
        ({"no.such.config": "1"}, "no.such.config"),
    ],
)
def test_a_bad_topic_config_is_refused_naming_it(
    broker: BrokerProcess, configs: dict[str, str], named: str
) -> None:
    admin = admin_for(broker)
    future = admin.create_topics([NewTopic(fresh("bad"), 1, 1, config=configs)])
    error = kafka_error(next(iter(future.values())))
    assert error.code() == KafkaError.INVALID_CONFIG
    assert named in error.str()


@pytest.mark.parametrize("version", ["0.10.0.0", "0.10.0", "0.10.0-IV1", "3.0-IV1", "0.8.2"])
def test_message_format_version_takes_every_form_kafka_reads(
    broker: BrokerProcess, version: str
) -> None:
    """Kafka 3.9 creates these topics and describes the value as given."""
    admin = admin_for(broker)
    topic = fresh("format")
    create_topics(admin, NewTopic(topic, 1, 1, config={"message.format.version": version}))
    described = topic_configs(admin, topic)["message.format.version"]
    assert described.value == version
    assert described.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value


def test_log_append_time_stamps_the_broker_time(broker: BrokerProcess) -> None:
    admin = admin_for(broker)
    topic = fresh("append-time")
    create_topics(admin, NewTopic(topic, 1, 1, config={"message.timestamp.type": "LogAppendTime"}))
    before = int(time.time() * 1000)
    err, delivered = deliver(broker, topic, timestamp=1_000_000)
    after = int(time.time() * 1000)
    assert err is None
    # the Produce response carries the append time
    kind, stamped = delivered.timestamp()
    assert kind == TIMESTAMP_LOG_APPEND_TIME and before <= stamped <= after
    # and the stored batch: its type and time, read back (CRC rewritten: the consumer checks it)
    consumed = consume_one(broker, topic)
    assert consumed.timestamp() == (TIMESTAMP_LOG_APPEND_TIME, stamped)


def test_timestamp_bounds_refuse_records_out_of_range(broker: BrokerProcess) -> None:
    admin = admin_for(broker)
    now = int(time.time() * 1000)
    bounded = fresh("bounded")
    create_topics(
        admin,
        NewTopic(bounded, 1, 1, config={"message.timestamp.before.max.ms": "60000"}),
    )
    err, _ = deliver(broker, bounded, timestamp=now - 3_600_000, retries=0)
    assert err is not None and err.code() == KafkaError.INVALID_TIMESTAMP
    err, _ = deliver(broker, bounded, timestamp=now + 3_600_000, retries=0)
    assert err is None  # no bound after now
    # the deprecated difference.max.ms bounds both sides where before/after are unset
    legacy = fresh("legacy")
    create_topics(
        admin,
        NewTopic(legacy, 1, 1, config={"message.timestamp.difference.max.ms": "60000"}),
    )
    err, _ = deliver(broker, legacy, timestamp=now + 3_600_000, retries=0)
    assert err is not None and err.code() == KafkaError.INVALID_TIMESTAMP
    err, delivered = deliver(broker, legacy, timestamp=now)
    assert err is None and delivered.timestamp() == (TIMESTAMP_CREATE_TIME, now)


def test_min_insync_replicas_above_the_replicas_is_met_by_them(broker: BrokerProcess) -> None:
    """As Kafka 3.7+'s Partition.effectiveMinIsr: min.insync.replicas is capped at the
    partition's replicas, here its one, so acks=all goes through with a common production
    setting of 2 (a topic's, or every topic's through the broker default)."""
    admin = admin_for(broker)
    topic = fresh("min-isr")
    create_topics(admin, NewTopic(topic, 1, 1, config={"min.insync.replicas": "2"}))
    err, _ = deliver(broker, topic, acks="all", retries=0, **{"message.timeout.ms": 5000})
    assert err is None


def described(broker: BrokerProcess, kind: str, name: str) -> dict[str, Any]:
    """DescribeConfigs with synonyms through kafka-python, which keeps the synonym list as
    sent (confluent-kafka's is a dict by name, so a name listed twice shows once): name ->
    {value, config_source, read_only, synonyms: [(name, value, source)]}."""
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        resource_type = ConfigResourceType.BROKER if kind == "broker" else ConfigResourceType.TOPIC
        result = admin.describe_configs(
            [KafkaConfigResource(resource_type, name)], include_synonyms=True, config_filter="all"
        )
    finally:
        admin.close()
    return {
        config: {
            **entry,
            "synonyms": [(s["name"], s["value"], s["source"]) for s in entry["synonyms"]],
        }
        for config, entry in result[kind][name].items()
    }


def alter_broker(admin: AdminClient, name: str, **ops: str | None) -> Any:
    """IncrementalAlterConfigs on broker resource ``name``: SET each value, DELETE a None."""
    entries = [
        ConfigEntry(key.replace("_", "."), value, incremental_operation=AlterConfigOpType.SET)
        if value is not None
        else ConfigEntry(key.replace("_", "."), "", incremental_operation=AlterConfigOpType.DELETE)
        for key, value in ops.items()
    ]
    resource = ConfigResource(ResourceType.BROKER, name, incremental_configs=entries)
    return admin.incremental_alter_configs([resource])[resource]


def cluster_defaults(broker: BrokerProcess) -> dict[str, tuple[str | None, int]]:
    """The cluster-wide dynamic defaults (the broker resource with the empty name, which
    neither client library names; Kafka's Java admin does): name -> (value, source)."""
    conn = RawConnection(broker.bootstrap)
    try:
        request = DescribeConfigsRequest[4](
            resources=[
                DescribeConfigsRequest.DescribeConfigsResource(
                    resource_type=4, resource_name="", configuration_keys=None
                )
            ],
            include_synonyms=True,
            include_documentation=False,
        )
        response = conn.call(request, DescribeConfigsResponse)
    finally:
        conn.close()
    (result,) = response.results
    assert result.error_code == 0, result.error_message
    return {c.name: (c.value, c.config_source) for c in result.configs}


def alter_cluster_defaults(broker: BrokerProcess, name: str = "", **configs: str) -> None:
    """IncrementalAlterConfigs SET on the cluster-wide defaults (the empty broker name; or
    another broker resource ``name``, which a client would send to that broker)."""
    alterable = IncrementalAlterConfigsRequest.AlterConfigsResource.AlterableConfig
    request = IncrementalAlterConfigsRequest[1](
        resources=[
            IncrementalAlterConfigsRequest.AlterConfigsResource(
                resource_type=4,
                resource_name=name,
                configs=[
                    alterable(name=k.replace("_", "."), config_operation=0, value=v)
                    for k, v in configs.items()
                ],
            )
        ],
        validate_only=False,
    )
    conn = RawConnection(broker.bootstrap)
    try:
        response = conn.call(request, IncrementalAlterConfigsResponse)
    finally:
        conn.close()
    (result,) = response.responses
    if result.error_code != 0:
        raise KafkaException(KafkaError(result.error_code, result.error_message))


def test_broker_configs_describe_kafkas_sources_and_synonyms(make_broker: MakeBroker) -> None:
    broker = make_broker(**{"log.retention.hours": "24", "log.segment.bytes": "2097152"})
    configs = described(broker, "broker", "0")
    hours = configs["log.retention.hours"]
    assert hours["value"] == "24" and hours["config_source"] == "STATIC_BROKER_CONFIG"
    assert hours["read_only"]
    assert hours["synonyms"] == [
        ("log.retention.hours", "24", "STATIC_BROKER_CONFIG"),
        ("log.retention.hours", "168", "DEFAULT_CONFIG"),
    ]
    # unset, and read by itself: null, DEFAULT_CONFIG, no synonym; it can change dynamically
    retention = configs["log.retention.ms"]
    assert retention["value"] is None and not retention["read_only"]
    assert retention["config_source"] == "DEFAULT_CONFIG" and retention["synonyms"] == []
    assert configs["log.segment.bytes"]["synonyms"] == [
        ("log.segment.bytes", "2097152", "STATIC_BROKER_CONFIG"),
        ("log.segment.bytes", str(1 << 30), "DEFAULT_CONFIG"),
    ]
    assert configs["node.id"]["read_only"]
    # the cluster-wide defaults: none set
    assert cluster_defaults(broker) == {}


def test_dynamic_broker_configs_change_topic_defaults_and_survive_a_restart(
    make_broker: MakeBroker,
) -> None:
    broker = make_broker()
    admin = admin_for(broker)
    topic = fresh("inherits")
    create_topics(admin, NewTopic(topic, 1, 1))

    # the cluster-wide default, then this broker's own over it
    alter_cluster_defaults(broker, log_retention_ms="3600000", message_max_bytes="5000")
    alter_broker(admin, "0", log_retention_ms="7200000").result(TIMEOUT)
    topic_described = described(broker, "topic", topic)
    retention = topic_described["retention.ms"]
    assert retention["value"] == "7200000"
    assert retention["config_source"] == "DYNAMIC_BROKER_CONFIG"
    assert retention["synonyms"] == [
        ("log.retention.ms", "7200000", "DYNAMIC_BROKER_CONFIG"),
        ("log.retention.ms", "3600000", "DYNAMIC_DEFAULT_BROKER_CONFIG"),
        ("log.retention.hours", "168", "DEFAULT_CONFIG"),
    ]
    assert topic_described["max.message.bytes"]["config_source"] == (
        "DYNAMIC_DEFAULT_BROKER_CONFIG"
    )
    assert cluster_defaults(broker) == {
        "log.retention.ms": ("3600000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value),
        "message.max.bytes": ("5000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value),
    }
    # the open partition takes the new max.message.bytes at once
    producer_config = {"retries": 0, "compression.type": "none"}
    producer = Producer({"bootstrap.servers": broker.bootstrap, **producer_config})
    reports: list[Any] = []
    producer.produce(topic, b"x" * 6000, partition=0, on_delivery=lambda e, m: reports.append(e))
    producer.flush(TIMEOUT)
    assert reports[0] is not None and reports[0].code() == KafkaError.MSG_SIZE_TOO_LARGE

    # a read-only property, and a bad value, are refused; nothing changes
    refused = kafka_error(alter_broker(admin, "0", listeners="PLAINTEXT://127.0.0.1:1"))
    assert refused.code() == KafkaError.INVALID_REQUEST
    assert "Cannot update these configs dynamically: Set(listeners)" in refused.str()
    # (Kafka's broker answers a bad broker config INVALID_REQUEST, not INVALID_CONFIG)
    bad = kafka_error(alter_broker(admin, "0", log_cleanup_policy="shred"))
    assert bad.code() == KafkaError.INVALID_REQUEST and "log.cleanup.policy" in bad.str()
    negative = kafka_error(alter_broker(admin, "0", leader_replication_throttled_rate="-1"))
    assert negative.code() == KafkaError.INVALID_REQUEST
    assert "leader.replication.throttled.rate" in negative.str()
    with pytest.raises(KafkaException) as raised:
        alter_cluster_defaults(broker, "7", log_retention_ms="1")
    other = raised.value.args[0]
    assert other.code() == KafkaError.INVALID_REQUEST and "Unexpected broker id" in other.str()

    broker.stop()
    broker.start()
    after = topic_configs(admin_for(broker), topic)
    assert after["retention.ms"].value == "7200000"
    assert after["max.message.bytes"].value == "5000"

    # deleting this broker's value uncovers the cluster default
    admin = admin_for(broker)
    alter_broker(admin, "0", log_retention_ms=None).result(TIMEOUT)
    after = topic_configs(admin_for(broker), topic)
    assert after["retention.ms"].value == "3600000"
    assert after["retention.ms"].source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value


def kafka_39_advertised(value: str | None, *synonyms: tuple[str, str, str]) -> dict[str, Any]:
    """Kafka 3.9.0's DescribeConfigs entry for a broker's advertised.listeners, as a Kafka 3.9.0
    KRaft broker answered it: ConfigHelper.createBrokerConfigEntry makes it writable (it is in
    DynamicBrokerConfig.AllDynamicConfigs, by DynamicListenerConfig), a STRING whose default
    is null (so unset: no value, DEFAULT_CONFIG, no synonym), not sensitive; its source is its
    first synonym's."""
    return {
        "value": value,
        "read_only": False,
        "config_source": synonyms[0][2] if synonyms else "DEFAULT_CONFIG",
        "is_sensitive": False,
        "synonyms": list(synonyms),
        "config_type": "STRING",
        "documentation": None,
    }


def test_replication_throttles_are_taken_as_kafka_takes_them(broker: BrokerProcess) -> None:
    """kafka-reassign-partitions.sh --throttle sets the replication throttles on the brokers:
    they are taken per broker and as cluster defaults and described as dynamic configs (with
    no replica traffic over shared storage, nothing is throttled)."""
    admin = admin_for(broker)
    alter_broker(admin, "0", leader_replication_throttled_rate="50000000").result(TIMEOUT)
    alter_cluster_defaults(broker, follower_replication_throttled_rate="40000000")
    configs = described(broker, "broker", "0")
    leader = configs["leader.replication.throttled.rate"]
    assert (leader["value"], leader["config_source"], leader["read_only"]) == (
        "50000000",
        "DYNAMIC_BROKER_CONFIG",
        False,
    )
    follower = configs["follower.replication.throttled.rate"]
    assert (follower["value"], follower["config_source"]) == (
        "40000000",
        "DYNAMIC_DEFAULT_BROKER_CONFIG",
    )
    unset = configs["replica.alter.log.dirs.io.max.bytes.per.second"]
    assert (unset["value"], unset["config_source"]) == (str((1 << 63) - 1), "DEFAULT_CONFIG")
    alter_broker(admin, "0", leader_replication_throttled_rate=None).result(TIMEOUT)
    assert described(broker, "broker", "0")["leader.replication.throttled.rate"][
        "config_source"
    ] == ("DEFAULT_CONFIG")


def test_unset_advertised_listeners_are_described_as_kafka_39s(broker: BrokerProcess) -> None:
    assert described(broker, "broker", "0")["advertised.listeners"] == kafka_39_advertised(None)


def test_advertised_listeners_change_per_broker_as_on_kafka_39(make_broker: MakeBroker) -> None:
    """Kafka 3.9's KRaft broker takes advertised.listeners per broker, but only naming the
    endpoints it registered: the same ones however written are accepted (and described as its
    dynamic config), others refused with its messages, and the cluster-wide default refused."""
    port = free_port()
    address = f"PLAINTEXT://127.0.0.1:{port}"
    broker = make_broker(**{"listeners": address, "advertised.listeners": address})
    static = ("advertised.listeners", address, "STATIC_BROKER_CONFIG")
    assert described(broker, "broker", "0")["advertised.listeners"] == (
        kafka_39_advertised(address, static)
    )

    admin = admin_for(broker)
    same = f"plaintext://127.0.0.1:{port}"
    alter_broker(admin, "0", advertised_listeners=same).result(TIMEOUT)
    dynamic = ("advertised.listeners", same, "DYNAMIC_BROKER_CONFIG")
    assert described(broker, "broker", "0")["advertised.listeners"] == (
        kafka_39_advertised(same, dynamic, static)
    )
    brokers = admin.list_topics(timeout=TIMEOUT).brokers.values()
    assert [(b.host, b.port) for b in brokers] == [("127.0.0.1", port)]

    moved = kafka_error(
        alter_broker(admin, "0", advertised_listeners=f"PLAINTEXT://localhost:{port}")
    )
    assert moved.code() == KafkaError.INVALID_REQUEST
    assert moved.str() == (
        "Invalid value org.apache.kafka.common.config.ConfigException: Advertised listeners "
        "cannot be altered when using a Raft-based metadata quorum. for configuration Invalid "
        "dynamic configuration"
    )
    unknown = kafka_error(alter_broker(admin, "0", advertised_listeners=f"{address},SSL://a:1"))
    assert unknown.code() == KafkaError.INVALID_REQUEST
    assert unknown.str() == (
        "requirement failed: advertised.listeners listener names must be equal to or a subset "
        "of the ones defined in listeners. Found PLAINTEXT,SSL. The valid options based on the "
        "current configuration are PLAINTEXT"
    )
    with pytest.raises(KafkaException) as raised:
        alter_cluster_defaults(broker, advertised_listeners=address)
    cluster = raised.value.args[0]
    assert cluster.code() == KafkaError.INVALID_REQUEST
    assert cluster.str() == (
        "Cannot update these configs at default cluster level, broker id must be specified: "
        "Set(advertised.listeners)"
    )

    alter_broker(admin, "0", advertised_listeners=None).result(TIMEOUT)
    assert described(broker, "broker", "0")["advertised.listeners"] == (
        kafka_39_advertised(address, static)
    )


def stored_batches(broker: BrokerProcess, topic: str) -> list[Any]:
    """The headers of the batches partition 0 of ``topic`` stores, read by a raw Fetch."""
    request = fetch_request(topic, {0: 0}, max_wait_ms=0, version=10)  # zstd needs v10
    conn = RawConnection(broker.bootstrap)
    try:
        response = conn.call(request, FetchResponse)
    finally:
        conn.close()
    data = memoryview(response.responses[0].partitions[0].records or b"")
    return [header for header, _ in record_batch.iter_batches(data)]


@pytest.mark.parametrize(("topic_codec", "stored"), [("zstd", "ZSTD"), ("uncompressed", "NONE")])
def test_compression_type_recompresses_what_the_producer_sent(
    broker: BrokerProcess, topic_codec: str, stored: str
) -> None:
    admin = admin_for(broker)
    topic = fresh(f"codec-{topic_codec}")
    create_topics(admin, NewTopic(topic, 1, 1, config={"compression.type": topic_codec}))
    sent = "gzip" if topic_codec == "uncompressed" else "none"
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "linger.ms": 50, "compression.type": sent}
    )
    for i in range(20):
        producer.produce(topic, b"v" * 1000, key=str(i).encode(), partition=0)
    assert producer.flush(TIMEOUT) == 0
    headers = stored_batches(broker, topic)
    assert headers and all(h.compression == stored for h in headers)
    consumed = consume_one(broker, topic)  # the records read back as sent
    assert consumed.key() == b"0" and consumed.value() == b"v" * 1000
