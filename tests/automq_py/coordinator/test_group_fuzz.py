"""Fuzzing the group APIs of the live broker process: no frame may crash or wedge it.

Two kinds of examples, each sent on a fresh connection:

* a well-formed request of one of the twelve group APIs (JoinGroup ... ConsumerGroupDescribe)
  mutated as ``test_broker_fuzz`` mutates frames (bit flips, truncation, overwritten integers,
  huge counts, random tails, broken size prefixes);
* a well-formed request whose fields are random: generations, member ids and epochs (known
  ones among them), huge and negative timeouts, random protocols and assignments, unknown
  topics and partitions, random assignors and regexes. Such a request must be answered with a
  response that decodes and carries its correlation id, or still be waited on (a JoinGroup or
  SyncGroup may wait for a rebalance); the connection must not be dropped.

The seeds name a stable classic group and a consumer-protocol group made in the fixture, so
mutations reach the coordinator's deeper paths. After every example the broker process must be
alive and answer ApiVersions and ListGroups on a new connection; after all of them a real
confluent-kafka consumer must still join a group and get its partitions. The broker runs with
``group.initial.rebalance.delay.ms=0`` and every read gives up after 0.3 s, so a JoinGroup
that waits for a rebalance only costs that.
"""

from __future__ import annotations

import struct
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from automq_py.apis import consumer_groups, groups
from protocol import headers
from protocol.api_keys import ApiKey
from protocol.entity_reader import read_entity
from protocol.messages import response_schema
from tests.automq_py.conftest import MakeBroker
from tests.automq_py.coordinator.test_group_errors import (
    TOPIC,
    assert_serving,
    commit,
    consumer_heartbeat,
    join,
    request_payload,
    subscription,
    sync,
    with_orders_topic,
)
from tests.automq_py.network.test_broker_fuzz import exchange, frame, mutated_frames
from tests.support.broker import BrokerProcess

# the group APIs' served versions: the classic ones' and the consumer protocol's
HANDLERS = {**groups.HANDLERS, **consumer_groups.HANDLERS}

pytestmark = pytest.mark.integration

FUZZ = settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
# JoinGroup and SyncGroup may wait for the rest of the group; nothing else waits
WAITING_APIS = {ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP}


@dataclass(slots=True, frozen=True)
class KnownGroups:
    """Groups the fixture made, for requests that name real members."""

    classic_group: str
    classic_member: str
    generation: int
    modern_group: str
    modern_member: str
    epoch: int
    topic_id: uuid.UUID


@pytest.fixture
def fuzz_broker(make_broker: MakeBroker) -> BrokerProcess:
    """A fresh broker whose new groups rebalance at once, with topic ``orders`` (2 partitions)."""
    return with_orders_topic(make_broker(**{"group.initial.rebalance.delay.ms": "0"}))


def make_groups(b: BrokerProcess) -> KnownGroups:
    """A stable one-member classic group and a one-member consumer-protocol group, both with
    committed offsets."""
    joined = join(b, "fuzz-classic", version=3, session_ms=60_000)
    assert joined.error_code == 0
    member, generation = joined.member_id, joined.generation_id
    assert sync(b, "fuzz-classic", generation, member, {member: b"both"}).error_code == 0
    assert commit(b, "fuzz-classic", generation, member, {0: (1, "c")}) == {0: 0}

    modern_member = str(uuid.uuid4())
    beat = consumer_heartbeat(b, "fuzz-modern", modern_member, 0, topics=[TOPIC])
    assert beat.error_code == 0 and beat.assignment is not None
    (assigned,) = beat.assignment.topic_partitions
    assert commit(b, "fuzz-modern", beat.member_epoch, modern_member, {1: (2, "m")}, version=9) == {
        1: 0
    }
    return KnownGroups(
        "fuzz-classic",
        member,
        generation,
        "fuzz-modern",
        modern_member,
        beat.member_epoch,
        assigned.topic_id,
    )


def assert_a_consumer_group_works(b: BrokerProcess) -> None:
    """A real librdkafka consumer joins a new group, gets both partitions and commits."""
    consumer = Consumer(
        {
            "bootstrap.servers": b.bootstrap,
            "group.id": f"after-fuzz-{uuid.uuid4().hex[:8]}",
            "session.timeout.ms": 10_000,
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([TOPIC])
        deadline = time.monotonic() + 30
        while len(consumer.assignment()) < 2:
            assert time.monotonic() < deadline, f"no assignment after fuzzing:\n{b.log_tail()}"
            consumer.poll(0.2)
        assert sorted(tp.partition for tp in consumer.assignment()) == [0, 1]
        consumer.commit(offsets=[TopicPartition(TOPIC, 0, 0)], asynchronous=False)
        (committed,) = consumer.committed([TopicPartition(TOPIC, 0)], timeout=10)
        assert committed.offset == 0
    finally:
        consumer.close()


# --- seeds: one or two well-formed requests per API ---------------------------------------------


def seed_requests(k: KnownGroups) -> list[tuple[int, int, dict[str, Any]]]:
    """(api key, version, body) of good requests naming the known groups and members."""
    protocols = [{"name": "range", "metadata": subscription(TOPIC)}]
    join_body = {
        "group_id": k.classic_group,
        "session_timeout": 10_000,
        "rebalance_timeout": 10_000,
        "member_id": k.classic_member,
        "protocol_type": "consumer",
        "protocols": protocols,
    }
    sync_body = {
        "group_id": k.classic_group,
        "generation_id": k.generation,
        "member_id": k.classic_member,
        "protocol_type": "consumer",
        "protocol_name": "range",
        "assignments": [{"member_id": k.classic_member, "assignment": b"both"}],
    }
    beat = {"group_id": k.classic_group, "generation_id": k.generation, "member_id": "x"}
    offsets = [{"partition_index": 0, "committed_offset": 3, "committed_metadata": "meta"}]
    commit_body = {
        "group_id": k.classic_group,
        "generation_id_or_member_epoch": k.generation,
        "member_id": k.classic_member,
        "retention_time": -1,
        "topics": [{"name": TOPIC, "partitions": offsets}],
    }
    wanted = [{"name": TOPIC, "partition_indexes": [0, 1]}]
    cgh = {
        "group_id": k.modern_group,
        "member_id": k.modern_member,
        "member_epoch": k.epoch,
        "rebalance_timeout": -1,
        "subscribed_topic_names": [TOPIC],
        "server_assignor": "uniform",
        "topic_partitions": [{"topic_id": k.topic_id, "partitions": [0]}],
    }
    return [
        (ApiKey.JOIN_GROUP, 9, {**join_body, "member_id": ""}),
        (ApiKey.JOIN_GROUP, 5, join_body),
        (ApiKey.JOIN_GROUP, 1, join_body),
        (ApiKey.SYNC_GROUP, 5, sync_body),
        (ApiKey.SYNC_GROUP, 2, sync_body),
        (ApiKey.HEARTBEAT, 4, {**beat, "member_id": k.classic_member}),
        (ApiKey.HEARTBEAT, 0, beat),
        (ApiKey.LEAVE_GROUP, 5, {"group_id": "fuzz-other", "members": [{"member_id": "x"}]}),
        (ApiKey.LEAVE_GROUP, 0, {"group_id": "fuzz-other", "member_id": "x"}),
        (ApiKey.OFFSET_COMMIT, 9, commit_body),
        (ApiKey.OFFSET_COMMIT, 2, commit_body),
        (ApiKey.OFFSET_FETCH, 9, {"groups": [{"group_id": k.modern_group, "topics": wanted}]}),
        (ApiKey.OFFSET_FETCH, 3, {"group_id": k.classic_group, "topics": wanted}),
        (ApiKey.OFFSET_FETCH, 1, {"group_id": k.classic_group, "topics": wanted}),
        (
            ApiKey.OFFSET_DELETE,
            0,
            {"group_id": k.classic_group, "topics": [{"name": "gone", "partitions": [{}]}]},
        ),
        (ApiKey.LIST_GROUPS, 5, {"states_filter": ["Stable"], "types_filter": ["classic"]}),
        (ApiKey.LIST_GROUPS, 0, {}),
        (ApiKey.DESCRIBE_GROUPS, 5, {"groups": [k.classic_group, k.modern_group, "none"]}),
        (ApiKey.DESCRIBE_GROUPS, 0, {"groups": [k.classic_group]}),
        (ApiKey.DELETE_GROUPS, 2, {"groups_names": ["fuzz-other", "none"]}),
        (ApiKey.DELETE_GROUPS, 0, {"groups_names": ["none"]}),
        (ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, cgh),
        (ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, {**cgh, "member_id": "", "member_epoch": 0}),
        (ApiKey.CONSUMER_GROUP_DESCRIBE, 0, {"group_ids": [k.modern_group, k.classic_group]}),
        (ApiKey.CONSUMER_GROUP_DESCRIBE, 0, {"group_ids": [k.modern_group]}),
    ]


# --- well-formed requests with random values ---------------------------------------------------


def random_requests(k: KnownGroups) -> st.SearchStrategy[tuple[int, int, dict[str, Any]]]:
    group_ids = st.one_of(
        st.sampled_from([k.classic_group, k.modern_group, "fuzz-new", "", "grüppe", "g" * 300]),
        st.text(max_size=16),
    )
    member_ids = st.one_of(
        st.sampled_from([k.classic_member, k.modern_member, "", "ghost"]), st.text(max_size=40)
    )
    instance_ids = st.one_of(st.none(), st.sampled_from(["host-1", ""]), st.text(max_size=8))
    generations = st.one_of(st.sampled_from([k.generation, k.epoch, -2, -1, 0, 1, 2]), INT32)
    timeouts = st.one_of(
        st.sampled_from([-(1 << 31), -1, 0, 1, 5999, 6000, 1_800_001, (1 << 31) - 1]), INT32
    )
    topics = st.one_of(
        st.sampled_from([TOPIC, "missing", "", "__consumer_offsets"]), st.text(max_size=12)
    )
    partitions = st.one_of(st.integers(-1, 3), INT32)
    metadata = st.one_of(st.none(), st.text(max_size=32), st.just("m" * 4097))
    protocols = st.lists(
        st.fixed_dictionaries(
            {
                "name": st.one_of(
                    st.sampled_from(["range", "roundrobin", ""]), st.text(max_size=8)
                ),
                "metadata": st.one_of(st.just(subscription(TOPIC)), st.binary(max_size=200)),
            }
        ),
        max_size=4,
    )
    assignments = st.lists(
        st.fixed_dictionaries({"member_id": member_ids, "assignment": st.binary(max_size=64)}),
        max_size=3,
    )
    committed = st.lists(
        st.fixed_dictionaries(
            {
                "name": topics,
                "partitions": st.lists(
                    st.fixed_dictionaries(
                        {
                            "partition_index": partitions,
                            "committed_offset": st.one_of(
                                st.integers(-2, 100), st.integers(-(1 << 63), (1 << 63) - 1)
                            ),
                            "committed_leader_epoch": st.integers(-1, 5),
                            "committed_metadata": metadata,
                        }
                    ),
                    max_size=3,
                ),
            }
        ),
        max_size=3,
    )
    fetched = st.one_of(
        st.none(),
        st.lists(
            st.fixed_dictionaries(
                {"name": topics, "partition_indexes": st.lists(partitions, max_size=3)}
            ),
            max_size=3,
        ),
    )
    owned = st.one_of(
        st.none(),
        st.lists(
            st.fixed_dictionaries(
                {
                    "topic_id": st.one_of(st.just(k.topic_id), st.uuids()),
                    "partitions": st.lists(partitions, max_size=3),
                }
            ),
            max_size=2,
        ),
    )
    names = st.lists(topics, max_size=3)
    bodies: dict[int, st.SearchStrategy[dict[str, Any]]] = {
        ApiKey.JOIN_GROUP: st.fixed_dictionaries(
            {
                "group_id": group_ids,
                "session_timeout": timeouts,
                "rebalance_timeout": timeouts,
                "member_id": member_ids,
                "group_instance_id": instance_ids,
                "protocol_type": st.one_of(st.sampled_from(["consumer", "connect", ""]), st.text()),
                "protocols": protocols,
                "reason": st.one_of(st.none(), st.text(max_size=8)),
            }
        ),
        ApiKey.SYNC_GROUP: st.fixed_dictionaries(
            {
                "group_id": group_ids,
                "generation_id": generations,
                "member_id": member_ids,
                "group_instance_id": instance_ids,
                "protocol_type": st.one_of(st.none(), st.sampled_from(["consumer", "x"])),
                "protocol_name": st.one_of(st.none(), st.sampled_from(["range", "x"])),
                "assignments": assignments,
            }
        ),
        ApiKey.HEARTBEAT: st.fixed_dictionaries(
            {
                "group_id": group_ids,
                "generation_id": generations,
                "member_id": member_ids,
                "group_instance_id": instance_ids,
            }
        ),
        ApiKey.LEAVE_GROUP: st.fixed_dictionaries(
            {
                "group_id": group_ids,
                "member_id": member_ids,
                "members": st.lists(
                    st.fixed_dictionaries(
                        {"member_id": member_ids, "group_instance_id": instance_ids}
                    ),
                    max_size=3,
                ),
            }
        ),
        ApiKey.OFFSET_COMMIT: st.fixed_dictionaries(
            {
                "group_id": group_ids,
                "generation_id_or_member_epoch": generations,
                "member_id": member_ids,
                "group_instance_id": instance_ids,
                # the encoder goes through a float timedelta: exact up to 2**53; larger
                # values are test_group_errors.test_any_offset_retention_time_is_answered's
                "retention_time": st.one_of(st.just(-1), st.integers(-(1 << 53), 1 << 53)),
                "topics": committed,
            }
        ),
        ApiKey.OFFSET_FETCH: st.fixed_dictionaries(
            {
                "group_id": group_ids,
                "topics": fetched,
                "require_stable": st.booleans(),
                "groups": st.lists(
                    st.fixed_dictionaries(
                        {
                            "group_id": group_ids,
                            "member_id": st.one_of(st.none(), member_ids),
                            "member_epoch": generations,
                            "topics": fetched,
                        }
                    ),
                    max_size=3,
                ),
            }
        ),
        ApiKey.OFFSET_DELETE: st.fixed_dictionaries(
            {
                "group_id": group_ids,
                "topics": st.lists(
                    st.fixed_dictionaries(
                        {
                            "name": topics,
                            "partitions": st.lists(
                                st.fixed_dictionaries({"partition_index": partitions}),
                                max_size=3,
                            ),
                        }
                    ),
                    max_size=3,
                ),
            }
        ),
        ApiKey.LIST_GROUPS: st.fixed_dictionaries(
            {
                "states_filter": st.lists(
                    st.one_of(
                        st.sampled_from(["Stable", "empty", "Dead", "Assigning"]),
                        st.text(max_size=8),
                    ),
                    max_size=3,
                ),
                "types_filter": st.lists(
                    st.one_of(st.sampled_from(["classic", "Consumer"]), st.text(max_size=8)),
                    max_size=2,
                ),
            }
        ),
        ApiKey.DESCRIBE_GROUPS: st.fixed_dictionaries(
            {
                "groups": st.lists(group_ids, max_size=4),
                "include_authorized_operations": st.booleans(),
            }
        ),
        ApiKey.DELETE_GROUPS: st.fixed_dictionaries(
            # the known groups are left alone: the seeds of the other test name them
            {"groups_names": st.lists(st.text(max_size=12), max_size=3)}
        ),
        ApiKey.CONSUMER_GROUP_HEARTBEAT: st.fixed_dictionaries(
            {
                "group_id": group_ids,
                "member_id": member_ids,
                "member_epoch": generations,
                "instance_id": instance_ids,
                "rack_id": st.one_of(st.none(), st.text(max_size=4)),
                "rebalance_timeout": timeouts,
                "subscribed_topic_names": st.one_of(st.none(), names),
                "subscribed_topic_regex": st.one_of(
                    st.none(), st.sampled_from(["", ".*", "ord.*", "(", "[a-", "(a+)+$"])
                ),
                "server_assignor": st.one_of(
                    st.none(), st.sampled_from(["uniform", "range", "sticky", ""])
                ),
                "topic_partitions": owned,
            }
        ),
        ApiKey.CONSUMER_GROUP_DESCRIBE: st.fixed_dictionaries(
            {
                "group_ids": st.lists(group_ids, max_size=4),
                "include_authorized_operations": st.booleans(),
            }
        ),
    }
    return st.one_of(
        *(
            st.tuples(st.just(key), st.integers(HANDLERS[key][1], HANDLERS[key][2]), body)
            for key, body in bodies.items()
        )
    )


def assert_answered_or_waiting(
    api_key: int, version: int, correlation_id: int, response: bytes, closed: bool
) -> None:
    """A well-formed request gets one decodable response with its correlation id; only
    JoinGroup and SyncGroup may still be waiting; the connection stays open."""
    if len(response) < 4 or len(response) < 4 + struct.unpack_from(">i", response)[0]:
        assert not closed, f"connection closed after {len(response)} bytes"
        assert api_key in WAITING_APIS, f"no answer to api {api_key} v{version}"
        return
    schema = response_schema(api_key, version)
    header_version = int(schema.__header_schema__.__version__)  # type: ignore[attr-defined]
    body = memoryview(response)[4:]
    got, pos = headers.decode_response_header(body, header_version)
    assert got == correlation_id
    _, end = read_entity(schema, body, pos)
    assert end == len(body), "trailing bytes after the response"


# --- the tests ---------------------------------------------------------------------------------


def test_mutated_group_requests_do_not_break_the_broker(fuzz_broker: BrokerProcess) -> None:
    known = make_groups(fuzz_broker)
    seeds = [
        request_payload(key, version, body, correlation_id=n + 1)
        for n, (key, version, body) in enumerate(seed_requests(known))
    ]
    for payload in seeds:  # the seeds themselves are answered (or waited on)
        response, closed = exchange(fuzz_broker.port, frame(payload))
        key, version = struct.unpack_from(">hh", payload)
        assert_answered_or_waiting(
            key, version, struct.unpack_from(">i", payload, 4)[0], response, closed
        )

    @FUZZ
    @given(data=st.data())
    def mutated(data: st.DataObject) -> None:
        sent = data.draw(mutated_frames(seeds))
        note(f"frame: {sent.hex()}")
        exchange(fuzz_broker.port, sent)
        assert_serving(fuzz_broker)

    mutated()
    assert_a_consumer_group_works(fuzz_broker)


def test_random_group_requests_do_not_break_the_broker(fuzz_broker: BrokerProcess) -> None:
    known = make_groups(fuzz_broker)

    @settings(FUZZ, max_examples=900)
    @given(request=random_requests(known))
    def random_values(request: tuple[int, int, dict[str, Any]]) -> None:
        api_key, version, body = request
        note(f"api {api_key} v{version}: {body!r}")
        payload = request_payload(api_key, version, body, correlation_id=4242)
        response, closed = exchange(fuzz_broker.port, frame(payload))
        note(f"response: {response.hex()} closed={closed}")
        assert_answered_or_waiting(api_key, version, 4242, response, closed)
        assert_serving(fuzz_broker)

    random_values()
    assert_a_consumer_group_works(fuzz_broker)
