"""The ``__consumer_offsets`` record format, group placement and offset expiry: pure logic."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_py.coordinator import records
from automq_py.coordinator.classic_group import ClassicGroup, ClassicState
from automq_py.coordinator.consumer_group import ConsumerGroup
from automq_py.coordinator.consumer_protocol import subscription_topics
from automq_py.coordinator.offsets import ExpiryRule, expired_offsets, expiry_rule
from automq_py.coordinator.runtime import java_string_hash, partition_for
from tests.automq_py.coordinator import kafka_oracle
from tests.protocol.kafka_oracle import uvarint

names = st.text(max_size=40)
opt_names = st.none() | names
i32 = st.integers(-(1 << 31), (1 << 31) - 1)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)


def test_java_string_hash_matches_java() -> None:
    # values from java.lang.String.hashCode
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(1 << 31)
    # a character outside the BMP counts as its two UTF-16 code units
    assert java_string_hash("\U0001f600") == 31 * 0xD83D + 0xDE00


def test_partition_for_is_kafkas_placement() -> None:
    # Utils.abs(hash) is hash & 0x7fffffff, so Integer.MIN_VALUE lands on partition 0
    assert partition_for("polygenelubricants", 50) == 0
    assert partition_for("hello", 50) == 99162322 % 50
    assert all(0 <= partition_for(f"g{i}", 7) < 7 for i in range(200))


def test_offset_commit_value_v3_layout() -> None:
    value = records.OffsetValue(42, 3, "meta", 1700000000000)
    raw = records.encode_offset_value(value)
    assert raw == struct.pack(">hqih4sq", 3, 42, 3, 4, b"meta", 1700000000000)
    key = records.encode_key(records.OffsetKey("g", "t", 5))
    assert key == struct.pack(">hh1sh1si", 1, 1, b"g", 1, b"t", 5)


def test_older_value_versions_are_read() -> None:
    v1 = struct.pack(">hqh2sqq", 1, 7, 2, b"md", 100, 200)
    assert records.decode_offset_value(v1) == records.OffsetValue(7, -1, "md", 100, 200)
    v0_group = struct.pack(">hh8sih5sh1si", 0, 8, b"consumer", 4, 5, b"range", 1, b"m", 1)
    v0_group += struct.pack(">h1sh1sh1si", 1, b"m", 1, b"c", 1, b"h", 10000)
    v0_group += struct.pack(">i2si3s", 2, b"su", 3, b"asg")
    group = records.decode_group_value(v0_group)
    assert group.generation == 4 and group.protocol == "range" and group.leader == "m"
    (member,) = group.members
    assert member.session_timeout == member.rebalance_timeout == 10000
    assert (member.subscription, member.assignment) == (b"su", b"asg")


@given(names, names, i32, i64, i32, names, i64)
def test_offset_records_round_trip(
    group: str, topic: str, partition: int, offset: int, epoch: int, meta: str, ts: int
) -> None:
    key = records.OffsetKey(group, topic, partition)
    assert records.decode_key(records.encode_key(key)) == key
    value = records.OffsetValue(offset, epoch, meta, ts)
    assert records.decode_value(key, records.encode_offset_value(value)) == value


members = st.builds(
    records.MemberValue,
    names,
    opt_names,
    names,
    names,
    i32,
    i32,
    st.binary(max_size=64),
    st.binary(max_size=64),
)


@given(names, names, i32, opt_names, opt_names, i64, st.lists(members, max_size=4).map(tuple))
def test_group_records_round_trip(
    group: str,
    protocol_type: str,
    generation: int,
    protocol: str | None,
    leader: str | None,
    ts: int,
    group_members: tuple[records.MemberValue, ...],
) -> None:
    key = records.GroupKey(group)
    assert records.decode_key(records.encode_key(key)) == key
    value = records.GroupValue(protocol_type, generation, protocol, leader, ts, group_members)
    assert records.decode_value(key, records.encode_group_value(value)) == value
    epoch = records.ConsumerGroupValue(generation)
    ckey = records.ConsumerGroupKey(group)
    assert records.decode_key(records.encode_key(ckey)) == ckey
    assert records.decode_value(ckey, records.encode_consumer_group_value(epoch)) == epoch


def test_tombstones_and_unknown_keys() -> None:
    key = records.GroupKey("g")
    assert records.decode_value(key, None) is None
    # the record types of Kafka this broker does not keep (share groups', streams') are
    # skipped, not errors
    assert records.decode_key(struct.pack(">hh1s", 9, 1, b"g")) is None


@given(st.binary(max_size=200))
def test_decoders_reject_garbage_cleanly(data: bytes) -> None:
    for decode in (
        records.decode_key,
        records.decode_offset_value,
        records.decode_group_value,
        records.decode_consumer_group_value,
    ):
        with contextlib.suppress(records.RecordFormatError):
            decode(data)
    for version in (5, 7, 8):
        with contextlib.suppress(records.RecordFormatError):
            records.decode_value(records.ConsumerMemberKey(version, "g", "m"), data)
    with contextlib.suppress(records.RecordFormatError):
        records.decode_value(records.TargetEpochKey("g"), data)


# --- a KIP-848 group's member records, against kafka-python's codec fed Kafka's schemas -------

topic_partitions = st.lists(
    st.tuples(st.uuids(), st.lists(i32, max_size=5).map(tuple)), max_size=4
).map(tuple)
member_metadata = st.builds(
    records.MemberMetadataValue,
    opt_names,
    opt_names,
    names,
    names,
    st.lists(names, max_size=4).map(tuple),
    opt_names,
    i32,
    opt_names,
    st.none()
    | st.builds(
        records.ClassicMemberMetadata,
        i32,
        st.lists(st.tuples(names, st.binary(max_size=20)), max_size=3).map(tuple),
    ),
)
current_assignments = st.builds(
    records.CurrentAssignmentValue,
    i32,
    i32,
    st.sampled_from([0, 1, 2]),
    topic_partitions,
    topic_partitions,
)


def _oracle_partitions(cls: type, value: records.TopicPartitions) -> list[object]:
    return [cls(topic_id=t, partitions=list(p)) for t, p in value]


@given(member_metadata)
def test_member_metadata_is_kafkas_layout(value: records.MemberMetadataValue) -> None:
    oracle = kafka_oracle.ConsumerGroupMemberMetadataValue(
        version=0,
        instance_id=value.instance_id,
        rack_id=value.rack_id,
        client_id=value.client_id,
        client_host=value.client_host,
        subscribed_topic_names=list(value.subscribed_topic_names),
        subscribed_topic_regex=value.subscribed_topic_regex,
        rebalance_timeout_ms=value.rebalance_timeout_ms,
        server_assignor=value.server_assignor,
    )
    if value.classic is not None:
        cls = kafka_oracle.ConsumerGroupMemberMetadataValue.ClassicMemberMetadata
        oracle.classic_member_metadata = cls(
            session_timeout_ms=value.classic.session_timeout_ms,
            supported_protocols=[
                cls.ClassicProtocol(name=name, metadata=metadata)
                for name, metadata in value.classic.protocols
            ],
        )
    ours = records.encode_member_value(value)
    assert ours == bytes(oracle.encode(version=0, header=True))
    key = records.ConsumerMemberKey(records.MEMBER_METADATA_KEY_VERSION, "g", "m")
    assert records.decode_value(key, ours) == value


@given(current_assignments)
def test_current_assignment_is_kafkas_layout(value: records.CurrentAssignmentValue) -> None:
    cls = kafka_oracle.ConsumerGroupCurrentMemberAssignmentValue
    oracle = cls(
        version=0,
        member_epoch=value.member_epoch,
        previous_member_epoch=value.previous_member_epoch,
        state=value.state,
        assigned_partitions=_oracle_partitions(cls.TopicPartitions, value.assigned),
        partitions_pending_revocation=_oracle_partitions(
            cls.TopicPartitions, value.pending_revocation
        ),
    )
    ours = records.encode_member_value(value)
    assert ours == bytes(oracle.encode(version=0, header=True))
    key = records.ConsumerMemberKey(records.CURRENT_ASSIGNMENT_KEY_VERSION, "g", "m")
    assert records.decode_value(key, ours) == value


@given(names, names, topic_partitions, i32)
def test_member_keys_and_target_records_round_trip(
    group: str, member: str, partitions: records.TopicPartitions, epoch: int
) -> None:
    for version in (5, 7, 8):
        key = records.ConsumerMemberKey(version, group, member)
        raw = records.encode_key(key)
        assert raw[:2] == struct.pack(">h", version)  # Kafka's key version: the record type
        assert records.decode_key(raw) == key
    target = records.TargetMemberValue(partitions)
    key = records.ConsumerMemberKey(records.TARGET_MEMBER_KEY_VERSION, group, member)
    assert records.decode_value(key, records.encode_member_value(target)) == target
    epoch_key = records.TargetEpochKey(group)
    assert records.decode_key(records.encode_key(epoch_key)) == epoch_key
    raw_epoch = records.encode_member_value(records.TargetEpochValue(epoch))
    assert records.decode_value(epoch_key, raw_epoch) == records.TargetEpochValue(epoch)
    # a tagged field Kafka may add later is skipped
    tagged = raw_epoch[:-1] + b"\x01\x00\x08" + bytes(8)
    assert records.decode_value(epoch_key, tagged) == records.TargetEpochValue(epoch)


@given(st.binary(max_size=300), st.integers(0, 299))
def test_truncated_group_values_fail_cleanly(tail: bytes, cut: int) -> None:
    value = records.GroupValue(
        "consumer",
        3,
        "range",
        "m",
        5,
        (records.MemberValue("m", None, "c", "/h", 1, 2, tail, b"x"),),
    )
    raw = records.encode_group_value(value)
    # every strict prefix misses part of a field
    with pytest.raises(records.RecordFormatError):
        records.decode_group_value(raw[: cut % len(raw)])


def test_subscription_topics() -> None:
    sub = struct.pack(">hih1sh2s", 1, 2, 1, b"a", 2, b"bb") + b"\xff\xff\xff\xff"
    assert subscription_topics(sub) == {"a", "bb"}
    assert subscription_topics(b"\x00") is None
    assert subscription_topics(struct.pack(">hi", 0, 1000)) is None


def _offset(commit_ts: int, expire: int = -1) -> records.OffsetValue:
    return records.OffsetValue(1, -1, "", commit_ts, expire)


def test_expiry_of_an_empty_group_counts_from_when_it_became_empty() -> None:
    """Kafka's Empty classic group: every offset counts from the moment the group became
    empty, one committed after it too (an admin's reset of an idle group)."""
    offsets = {("a", 0): _offset(1000), ("b", 0): _offset(5000)}
    rule = ExpiryRule(since_ms=2000)
    assert expired_offsets(offsets, 11_999, 10_000, rule) == []
    assert sorted(expired_offsets(offsets, 12_000, 10_000, rule)) == [("a", 0), ("b", 0)]
    # without the moment (a group record written without it): from each commit
    assert expired_offsets(offsets, 12_000, 10_000, ExpiryRule()) == [("a", 0)]


def test_expiry_of_an_active_group_keeps_subscribed_topics() -> None:
    offsets = {("a", 0): _offset(0), ("b", 0): _offset(0)}
    assert expired_offsets(offsets, 10**9, 10, ExpiryRule(subscribed=frozenset({"a"}))) == [
        ("b", 0)
    ]
    # a v1 commit's explicit expire timestamp wins
    assert expired_offsets({("c", 0): _offset(0, 50)}, 50, 10**6, ExpiryRule(0)) == [("c", 0)]


def test_an_offset_pending_in_a_transaction_does_not_expire() -> None:
    offsets = {("a", 0): _offset(0), ("a", 1): _offset(0)}
    assert expired_offsets(offsets, 10**9, 10, ExpiryRule(), pending={("a", 1)}) == [("a", 0)]


def test_the_rule_each_kind_of_group_expires_by() -> None:
    """Kafka's offsetExpirationCondition per group."""
    assert expiry_rule(None) == ExpiryRule()
    simple = ClassicGroup("s", 5000)  # commits only: no protocol type
    assert expiry_rule(simple) == ExpiryRule()
    idle = ClassicGroup("c", 5000)
    idle.protocol_type = "consumer"
    assert expiry_rule(idle) == ExpiryRule(since_ms=5000)
    idle.state_timestamp_ms = -1
    assert expiry_rule(idle) == ExpiryRule()
    idle.state = ClassicState.PREPARING_REBALANCE
    assert expiry_rule(idle) is None  # rebalancing: nothing expires
    connect = ClassicGroup("k", 5000)
    connect.protocol_type = "connect"
    connect.state = ClassicState.STABLE
    assert expiry_rule(connect) is None  # members' subscriptions unknown
    consumers = ConsumerGroup("n")
    assert expiry_rule(consumers) == ExpiryRule()


def test_a_commit_with_its_own_expiry_is_written_as_v1() -> None:
    value = records.OffsetValue(9, -1, "m", 1000, 5000)
    raw = records.encode_offset_value(value)
    assert raw[:2] == b"\x00\x01"
    assert records.decode_offset_value(raw) == value


@given(names, names, st.lists(names, max_size=5).map(tuple), i64, i64)
def test_regex_records_are_kafkas_layout(
    group: str, regex: str, topics: tuple[str, ...], version: int, timestamp: int
) -> None:
    key = records.RegexKey(group, regex)
    raw_key = records.encode_key(key)
    assert raw_key[:2] == struct.pack(">h", 16) and records.decode_key(raw_key) == key
    value = records.RegexValue(topics, version, timestamp)
    ours = records.encode_member_value(value)
    # ConsumerGroupRegularExpressionValue v0, flexible (kafka-python's codec cannot take a
    # field named Version): compact topics, two int64s, no tagged fields
    expected = struct.pack(">h", 0) + uvarint(len(topics) + 1)
    for t in topics:
        expected += uvarint(len(t.encode()) + 1) + t.encode()
    expected += struct.pack(">qq", version, timestamp) + b"\x00"
    assert ours == expected
    assert records.decode_value(key, ours) == value
