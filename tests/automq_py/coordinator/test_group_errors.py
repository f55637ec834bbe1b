"""The group APIs' error codes, with hand-built requests to the live broker process.

Requests are built and responses read with this repo's codec over kio's schemas
(``protocol.build`` + kio's writer; ``protocol.entity_reader``), one fresh connection each, so
a test can send what no client would: an empty group id, a stale generation, the old member
id of a fenced static member. Each test ends by checking that the broker process still
serves: a new connection gets ApiVersions and ListGroups answered. One broker serves the module:
each test names its own groups.

The error codes asserted are Apache Kafka's (its ``GroupCoordinatorService`` /
``GroupMetadataManager`` / ``OffsetMetadataManager`` rules); a test that fails here names a
place where this broker answers differently.
"""

from __future__ import annotations

import concurrent.futures
import socket
import struct
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import IO, Any, cast

import pytest
from kafka.protocol.consumer import OffsetCommitRequest  # type: ignore[import-untyped]
from kio.serial import entity_writer

from automq_py.coordinator.consumer_protocol import serialize_assignment
from protocol import build, headers
from protocol.api_keys import ApiKey
from protocol.entity_reader import read_entity
from protocol.errors import ErrorCode
from protocol.messages import BufferCollector, request_schema, response_schema
from tests.automq_py.conftest import MakeBroker, module_broker
from tests.protocol.kafka_oracle import request_frame
from tests.support.broker import BrokerProcess
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

TOPIC = "orders"
TIMEOUT_S = 10.0
# the broker's defaults: group.min/max.session.timeout.ms, offset.metadata.max.bytes
MIN_SESSION_MS, MAX_SESSION_MS = 6000, 1_800_000
METADATA_MAX_BYTES = 4096


def subscription(*topics: str) -> bytes:
    """A ConsumerProtocolSubscription v0: the topics and no user data."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


RANGE = [{"name": "range", "metadata": subscription(TOPIC)}]


# --- the wire --------------------------------------------------------------------------------


def request_payload(
    api_key: int, version: int, body: Mapping[str, Any], correlation_id: int = 1
) -> bytes:
    """Header + body of a request (no size prefix); ``body`` as kio field names."""
    schema = request_schema(api_key, version)
    header_version = int(schema.__header_schema__.__version__)  # type: ignore[attr-defined]
    header = headers.RequestHeader(api_key, version, correlation_id, "errors", header_version)
    out = BufferCollector(threshold=1 << 62)
    out.write(headers.encode_request_header(header))
    entity_writer(schema)(cast(IO[bytes], out), build.build(schema, body))
    return b"".join(bytes(p) for p in out.finish())


def exchange(port: int, payload: bytes, timeout: float = TIMEOUT_S) -> bytes:
    """Send one framed request on a new connection; the response frame (size stripped)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        received = bytearray()
        while len(received) < 4 or len(received) < 4 + struct.unpack_from(">i", received)[0]:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError(f"closed after {len(received)} bytes")
            received += chunk
    return bytes(received[4:])


def call(
    b: BrokerProcess,
    api_key: int,
    version: int,
    body: Mapping[str, Any],
    timeout: float = TIMEOUT_S,
) -> Any:
    """One request, answered: the decoded kio response."""
    response = exchange(b.port, request_payload(api_key, version, body, 77), timeout)
    schema = response_schema(api_key, version)
    header_version = int(schema.__header_schema__.__version__)  # type: ignore[attr-defined]
    correlation_id, pos = headers.decode_response_header(response, header_version)
    assert correlation_id == 77
    decoded, end = read_entity(schema, memoryview(response), pos)
    assert end == len(response), "trailing bytes after the response"
    return decoded


def assert_serving(b: BrokerProcess) -> None:
    """The process is alive and a new connection gets ApiVersions and ListGroups answered."""
    process = b._process
    assert process is not None and process.poll() is None, f"broker died:\n{b.log_tail()}"
    try:
        versions = call(b, ApiKey.API_VERSIONS, 3, {"client_software_name": "errors"})
        assert versions.error_code == ErrorCode.NONE
        assert {k.api_key for k in versions.api_keys} >= {
            ApiKey.JOIN_GROUP,
            ApiKey.CONSUMER_GROUP_HEARTBEAT,
        }
        groups = call(b, ApiKey.LIST_GROUPS, 5, {})
        assert groups.error_code == ErrorCode.NONE
    except (AssertionError, OSError) as e:
        raise AssertionError(f"broker stopped serving: {e!r}\n{b.log_tail()}") from e


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    """The module's broker (new groups rebalance at once) with topic ``orders`` of 2
    partitions."""
    with module_broker(
        tmp_path_factory, s3_server, **{"group.initial.rebalance.delay.ms": "0"}
    ) as b:
        yield with_orders_topic(b)


def with_orders_topic(b: BrokerProcess) -> BrokerProcess:
    topic = {"name": TOPIC, "num_partitions": 2, "replication_factor": 1}
    created = call(b, ApiKey.CREATE_TOPICS, 5, {"topics": [topic], "timeout": 5000})
    assert [t.error_code for t in created.topics] == [ErrorCode.NONE]
    return b


# --- the classic protocol, one call each ------------------------------------------------------


def join(
    b: BrokerProcess,
    group: str,
    member_id: str = "",
    *,
    version: int = 9,
    session_ms: int = 10_000,
    instance_id: str | None = None,
    protocol_type: str = "consumer",
    protocols: list[dict[str, Any]] | None = None,
    timeout: float = TIMEOUT_S,
) -> Any:
    return call(
        b,
        ApiKey.JOIN_GROUP,
        version,
        {
            "group_id": group,
            "session_timeout": session_ms,
            "rebalance_timeout": session_ms,
            "member_id": member_id,
            "group_instance_id": instance_id,
            "protocol_type": protocol_type,
            "protocols": RANGE if protocols is None else protocols,
        },
        timeout,
    )


def join_new_member(b: BrokerProcess, group: str, **options: Any) -> Any:
    """KIP-394: a JoinGroup for a member id, then the join with it."""
    first = join(b, group, **options)
    if first.error_code != ErrorCode.MEMBER_ID_REQUIRED:
        return first
    return join(b, group, first.member_id, **options)


def sync(
    b: BrokerProcess,
    group: str,
    generation: int,
    member_id: str,
    assignments: Mapping[str, bytes] | None = None,
    *,
    instance_id: str | None = None,
    protocol_type: str | None = "consumer",
    timeout: float = TIMEOUT_S,
) -> Any:
    return call(
        b,
        ApiKey.SYNC_GROUP,
        5,
        {
            "group_id": group,
            "generation_id": generation,
            "member_id": member_id,
            "group_instance_id": instance_id,
            "protocol_type": protocol_type,
            "protocol_name": "range",
            "assignments": [
                {"member_id": m, "assignment": a} for m, a in (assignments or {}).items()
            ],
        },
        timeout,
    )


def heartbeat(
    b: BrokerProcess,
    group: str,
    generation: int,
    member_id: str,
    instance_id: str | None = None,
) -> ErrorCode:
    body = {
        "group_id": group,
        "generation_id": generation,
        "member_id": member_id,
        "group_instance_id": instance_id,
    }
    return ErrorCode(call(b, ApiKey.HEARTBEAT, 4, body).error_code)


def commit(
    b: BrokerProcess,
    group: str,
    generation: int,
    member_id: str,
    offsets: Mapping[int, tuple[int, str | None]],
    *,
    version: int = 8,
    instance_id: str | None = None,
) -> dict[int, ErrorCode]:
    """OffsetCommit of ``{partition: (offset, metadata)}`` of ``orders``; the error of each."""
    partitions = [
        {"partition_index": p, "committed_offset": o, "committed_metadata": m}
        for p, (o, m) in offsets.items()
    ]
    response = call(
        b,
        ApiKey.OFFSET_COMMIT,
        version,
        {
            "group_id": group,
            "generation_id_or_member_epoch": generation,
            "member_id": member_id,
            "group_instance_id": instance_id,
            "retention_time": -1,
            "topics": [{"name": TOPIC, "partitions": partitions}],
        },
    )
    return {
        p.partition_index: ErrorCode(p.error_code) for t in response.topics for p in t.partitions
    }


def fetch_offsets(b: BrokerProcess, group: str) -> dict[int, tuple[int, str | None]]:
    """The committed ``{partition: (offset, metadata)}`` of ``orders`` (OffsetFetch v8)."""
    body = {
        "groups": [{"group_id": group, "topics": [{"name": TOPIC, "partition_indexes": [0, 1]}]}]
    }
    (found,) = call(b, ApiKey.OFFSET_FETCH, 8, body).groups
    assert found.error_code == ErrorCode.NONE
    return {
        p.partition_index: (p.committed_offset, p.metadata)
        for t in found.topics
        for p in t.partitions
        if p.committed_offset >= 0
    }


def stable_member(b: BrokerProcess, group: str, **options: Any) -> tuple[str, int]:
    """A one-member group, joined and synced: (member id, generation)."""
    joined = join_new_member(b, group, **options)
    assert joined.error_code == ErrorCode.NONE
    assert joined.leader == joined.member_id
    instance_id = options.get("instance_id")
    synced = sync(
        b,
        group,
        joined.generation_id,
        joined.member_id,
        {joined.member_id: b"all"},
        instance_id=instance_id,
    )
    assert synced.error_code == ErrorCode.NONE
    assert synced.assignment == b"all"
    return joined.member_id, joined.generation_id


def group_state(b: BrokerProcess, group: str) -> str:
    (described,) = call(b, ApiKey.DESCRIBE_GROUPS, 5, {"groups": [group]}).groups
    assert described.error_code == ErrorCode.NONE
    return str(described.group_state)


# --- JoinGroup ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [4, 9])
def test_join_without_a_member_id_is_given_one_first(broker: BrokerProcess, version: int) -> None:
    group = f"newcomers-v{version}"
    first = join(broker, group, version=version)
    assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED
    assert first.member_id.startswith("errors-")  # KIP-394: the client id, then a uuid
    assert first.generation_id == -1
    assert list(first.members) == []

    second = join(broker, group, first.member_id, version=version)
    assert second.error_code == ErrorCode.NONE
    assert second.member_id == first.member_id
    assert second.generation_id == 1
    assert second.leader == first.member_id
    assert second.protocol_name == "range"
    assert [(m.member_id, m.metadata) for m in second.members] == [
        (first.member_id, RANGE[0]["metadata"])
    ]
    assert_serving(broker)


def test_join_before_kip_394_needs_no_second_round(broker: BrokerProcess) -> None:
    joined = join(broker, "old-clients", version=3)
    assert joined.error_code == ErrorCode.NONE
    assert joined.member_id and joined.leader == joined.member_id
    assert joined.generation_id == 1
    assert_serving(broker)


def test_session_timeout_outside_the_bounds_is_invalid(broker: BrokerProcess) -> None:
    for session_ms in (MIN_SESSION_MS - 1, MAX_SESSION_MS + 1, 0, -1):
        refused = join(broker, "impatient", session_ms=session_ms)
        assert refused.error_code == ErrorCode.INVALID_SESSION_TIMEOUT, session_ms
    accepted = join(broker, "impatient", version=3, session_ms=MIN_SESSION_MS)
    assert accepted.error_code == ErrorCode.NONE
    assert_serving(broker)


def test_mismatched_protocols_are_inconsistent(broker: BrokerProcess) -> None:
    member, generation = stable_member(broker, "consumers")

    other_type = join(broker, "consumers", protocol_type="connect", version=3)
    assert other_type.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    roundrobin = [{"name": "roundrobin", "metadata": subscription(TOPIC)}]
    no_common = join(broker, "consumers", protocols=roundrobin, version=3)
    assert no_common.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    no_protocols = join(broker, "someone-else", protocols=[], version=3)
    assert no_protocols.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    # SyncGroup v5 names the protocol type: it must be the group's
    wrong_sync = sync(broker, "consumers", generation, member, protocol_type="connect")
    assert wrong_sync.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL

    assert heartbeat(broker, "consumers", generation, member) == ErrorCode.NONE
    assert_serving(broker)


# --- generations and members -------------------------------------------------------------------


def test_a_wrong_generation_is_illegal(broker: BrokerProcess) -> None:
    member, generation = stable_member(broker, "generations")

    for wrong in (generation + 1, generation - 1, 1 << 30):
        assert heartbeat(broker, "generations", wrong, member) == ErrorCode.ILLEGAL_GENERATION
        synced = sync(broker, "generations", wrong, member)
        assert synced.error_code == ErrorCode.ILLEGAL_GENERATION
        for version in (2, 8):
            errors = commit(broker, "generations", wrong, member, {0: (5, "")}, version=version)
            assert errors == {0: ErrorCode.ILLEGAL_GENERATION}
    assert fetch_offsets(broker, "generations") == {}

    assert heartbeat(broker, "generations", generation, member) == ErrorCode.NONE
    assert commit(broker, "generations", generation, member, {0: (5, "m")}) == {0: ErrorCode.NONE}
    assert fetch_offsets(broker, "generations") == {0: (5, "m")}
    assert_serving(broker)


def test_an_unknown_member_is_refused(broker: BrokerProcess) -> None:
    member, generation = stable_member(broker, "members")
    ghost = "ghost-" + str(uuid.uuid4())

    assert heartbeat(broker, "members", generation, ghost) == ErrorCode.UNKNOWN_MEMBER_ID
    assert sync(broker, "members", generation, ghost).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert commit(broker, "members", generation, ghost, {0: (1, "")}) == {
        0: ErrorCode.UNKNOWN_MEMBER_ID
    }
    assert join(broker, "members", ghost).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    left = call(
        broker, ApiKey.LEAVE_GROUP, 5, {"group_id": "members", "members": [{"member_id": ghost}]}
    )
    assert left.error_code == ErrorCode.NONE
    assert [(m.member_id, m.error_code) for m in left.members] == [
        (ghost, ErrorCode.UNKNOWN_MEMBER_ID)
    ]
    # a group that does not exist has no members either; LeaveGroup v3+ says so per member
    # (the request itself is fine, as in Kafka), v0-v2 in its one error
    assert heartbeat(broker, "no-such-group", 1, ghost) == ErrorCode.UNKNOWN_MEMBER_ID
    left = call(
        broker,
        ApiKey.LEAVE_GROUP,
        5,
        {"group_id": "no-such-group", "members": [{"member_id": ghost}]},
    )
    assert left.error_code == ErrorCode.NONE
    assert [(m.member_id, m.error_code) for m in left.members] == [
        (ghost, ErrorCode.UNKNOWN_MEMBER_ID)
    ]
    old = call(broker, ApiKey.LEAVE_GROUP, 2, {"group_id": "no-such-group", "member_id": ghost})
    assert old.error_code == ErrorCode.UNKNOWN_MEMBER_ID

    assert heartbeat(broker, "members", generation, member) == ErrorCode.NONE
    assert_serving(broker)


def test_heartbeat_while_another_member_joins_is_told_to_rejoin(broker: BrokerProcess) -> None:
    first, generation = stable_member(broker, "growing")
    second = join(broker, "growing")
    assert second.error_code == ErrorCode.MEMBER_ID_REQUIRED

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        # blocks until every known member has rejoined
        second_join = pool.submit(join, broker, "growing", second.member_id)
        deadline = time.monotonic() + TIMEOUT_S
        while group_state(broker, "growing") != "PreparingRebalance":
            assert time.monotonic() < deadline, "the join did not start a rebalance"
            time.sleep(0.05)
        assert heartbeat(broker, "growing", generation, first) == ErrorCode.REBALANCE_IN_PROGRESS
        assert not second_join.done()
        first_join = pool.submit(join, broker, "growing", first)
        joined = [second_join.result(TIMEOUT_S), first_join.result(TIMEOUT_S)]

    assert [j.error_code for j in joined] == [ErrorCode.NONE, ErrorCode.NONE]
    assert {j.generation_id for j in joined} == {generation + 1}
    leader = joined[1]
    assert leader.leader == first
    assert {m.member_id for m in leader.members} == {first, second.member_id}
    assert_serving(broker)


def test_a_replaced_static_member_is_fenced(broker: BrokerProcess) -> None:
    old, generation = stable_member(broker, "statics", instance_id="host-1")
    # the same instance starts again (a restarted process): no member id, a new one is made
    again = join(broker, "statics", instance_id="host-1")
    assert again.error_code == ErrorCode.NONE
    new = again.member_id
    assert new != old and new.startswith("host-1-")
    assert again.generation_id == generation  # no rebalance: the protocols did not change

    fenced = ErrorCode.FENCED_INSTANCE_ID
    assert heartbeat(broker, "statics", generation, old, "host-1") == fenced
    assert sync(broker, "statics", generation, old, instance_id="host-1").error_code == fenced
    assert commit(broker, "statics", generation, old, {0: (3, "")}, instance_id="host-1") == {
        0: fenced
    }
    left = call(
        broker,
        ApiKey.LEAVE_GROUP,
        5,
        {"group_id": "statics", "members": [{"member_id": old, "group_instance_id": "host-1"}]},
    )
    assert [m.error_code for m in left.members] == [fenced]
    # without its instance id the old id is just unknown
    assert heartbeat(broker, "statics", generation, old) == ErrorCode.UNKNOWN_MEMBER_ID

    assert heartbeat(broker, "statics", generation, new, "host-1") == ErrorCode.NONE
    assert_serving(broker)


# --- group ids ---------------------------------------------------------------------------------

EMPTY_GROUP_ID_REQUESTS: dict[str, tuple[int, int, dict[str, Any]]] = {
    "JoinGroup": (
        ApiKey.JOIN_GROUP,
        9,
        {
            "group_id": "",
            "session_timeout": 10_000,
            "rebalance_timeout": 10_000,
            "member_id": "",
            "protocol_type": "consumer",
            "protocols": RANGE,
        },
    ),
    "SyncGroup": (
        ApiKey.SYNC_GROUP,
        5,
        {
            "group_id": "",
            "generation_id": 1,
            "member_id": "m",
            "protocol_type": "consumer",
            "protocol_name": "range",
            "assignments": [],
        },
    ),
    "Heartbeat": (ApiKey.HEARTBEAT, 4, {"group_id": "", "generation_id": 1, "member_id": "m"}),
    "LeaveGroup": (ApiKey.LEAVE_GROUP, 5, {"group_id": "", "members": [{"member_id": "m"}]}),
    "OffsetDelete": (
        ApiKey.OFFSET_DELETE,
        0,
        {"group_id": "", "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0}]}]},
    ),
}


@pytest.mark.parametrize("api", sorted(EMPTY_GROUP_ID_REQUESTS))
def test_an_empty_group_id_is_invalid(broker: BrokerProcess, api: str) -> None:
    """Kafka's GroupCoordinatorService answers INVALID_GROUP_ID before looking for the group
    (OffsetCommit and OffsetFetch excepted: they accept "" for old clients)."""
    api_key, version, body = EMPTY_GROUP_ID_REQUESTS[api]
    response = call(broker, api_key, version, body)
    assert ErrorCode(response.error_code) == ErrorCode.INVALID_GROUP_ID, (
        f"BROKER BUG: {api} v{version} with group_id='' answered "
        f"{ErrorCode(response.error_code).name}; Kafka answers INVALID_GROUP_ID"
    )
    assert_serving(broker)


def test_the_empty_group_id_can_be_described_and_deleted(broker: BrokerProcess) -> None:
    """Kafka accepts "" in DescribeGroups and DeleteGroups as in OffsetCommit, so that a simple
    group an old client committed under it can be looked at and removed."""
    assert commit(broker, "", -1, "", {0: (1, "")}) == {0: ErrorCode.NONE}
    (described,) = call(broker, ApiKey.DESCRIBE_GROUPS, 5, {"groups": [""]}).groups
    assert (described.error_code, described.group_id, described.group_state) == (
        ErrorCode.NONE,
        "",
        "Empty",
    )
    deleted = call(broker, ApiKey.DELETE_GROUPS, 2, {"groups_names": [""]})
    assert [(r.group_id, r.error_code) for r in deleted.results] == [("", ErrorCode.NONE)]
    assert fetch_offsets(broker, "") == {}
    assert_serving(broker)


# --- offsets -----------------------------------------------------------------------------------


def test_offset_metadata_over_the_limit_is_refused(broker: BrokerProcess) -> None:
    at_limit, over = "m" * METADATA_MAX_BYTES, "m" * (METADATA_MAX_BYTES + 1)
    # a "simple" group: commits with no generation and no member
    assert commit(broker, "annotated", -1, "", {0: (7, at_limit), 1: (8, over)}) == {
        0: ErrorCode.NONE,
        1: ErrorCode.OFFSET_METADATA_TOO_LARGE,
    }
    assert commit(broker, "annotated", -1, "", {0: (9, over)}) == {
        0: ErrorCode.OFFSET_METADATA_TOO_LARGE
    }
    assert fetch_offsets(broker, "annotated") == {0: (7, at_limit)}
    assert_serving(broker)


def test_offset_metadata_limit_counts_characters(broker: BrokerProcess) -> None:
    """Kafka compares ``metadata.length()`` (UTF-16 code units) with offset.metadata.max.bytes:
    4096 "é" (8192 UTF-8 bytes) are within the limit, 4097 are not."""
    within, beyond = "é" * METADATA_MAX_BYTES, "é" * (METADATA_MAX_BYTES + 1)
    errors = commit(broker, "accented", -1, "", {0: (1, within), 1: (2, beyond)})
    assert errors == {0: ErrorCode.NONE, 1: ErrorCode.OFFSET_METADATA_TOO_LARGE}, (
        f"BROKER BUG: metadata of {METADATA_MAX_BYTES} non-ASCII characters answered "
        f"{errors[0].name}; Kafka counts characters, not UTF-8 bytes"
    )
    assert fetch_offsets(broker, "accented") == {0: (1, within)}
    assert_serving(broker)


# OffsetCommit v2: Long.MAX_VALUE / 1000 + 1 ms, the first retention time kio cannot read
FIRST_UNREADABLE_RETENTION_MS = (1 << 63) // 1000 + 1


@pytest.mark.parametrize(
    "retention_ms",
    [-1, 86_400_000, FIRST_UNREADABLE_RETENTION_MS, (1 << 63) - 1, -(1 << 63)],
)
def test_any_offset_retention_time_is_answered(broker: BrokerProcess, retention_ms: int) -> None:
    """Found fuzzing OffsetCommit values: any retention time is answered, as Kafka answers it.

    OffsetCommit v2-v4 carry ``retention_time_ms``, an int64 (-1: the broker's default).
    kio's native reader turns it into a ``timedelta`` and refuses anything beyond
    ``Long.MAX_VALUE / 1000`` ms either way (an int64 of microseconds); read that way, the
    request would fail to decode ("timedelta milliseconds overflow") and the connection close
    with no response. The frame is built by
    kafka-python (kio's own encoder rounds large values through a float).
    """
    topic = OffsetCommitRequest.OffsetCommitRequestTopic
    offsets = topic.OffsetCommitRequestPartition(
        partition_index=0, committed_offset=5, committed_metadata=""
    )
    group = f"retained-{retention_ms}"
    message = OffsetCommitRequest[2](
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        retention_time_ms=retention_ms,
        topics=[topic(name=TOPIC, partitions=[offsets])],
    )
    payload = request_frame(message, correlation_id=5)
    try:
        response = exchange(broker.port, payload)
    except ConnectionError as e:
        raise AssertionError(
            f"BROKER BUG: OffsetCommit v2 with retention_time_ms={retention_ms} closed the "
            f"connection ({e}); Kafka answers it. Frame: {payload.hex()}\n"
            + "\n".join(line for line in broker.log_tail(5).splitlines() if "closing" in line)
        ) from None
    correlation_id, pos = headers.decode_response_header(response, 0)
    assert correlation_id == 5
    decoded: Any
    decoded, _ = read_entity(response_schema(ApiKey.OFFSET_COMMIT, 2), memoryview(response), pos)
    assert [p.error_code for t in decoded.topics for p in t.partitions] == [ErrorCode.NONE]
    assert fetch_offsets(broker, group) == {0: (5, "")}
    assert_serving(broker)


def test_huge_member_metadata_fails_the_sync_not_the_broker(broker: BrokerProcess) -> None:
    """2 MiB of subscription metadata: the join is answered (requests may be 100 MB), but the
    group record cannot be stored (``__consumer_offsets`` takes batches up to max.message.bytes,
    1 MiB). Like Kafka (MESSAGE_TOO_LARGE -> UNKNOWN_SERVER_ERROR), the leader's SyncGroup gets
    UNKNOWN_SERVER_ERROR at once and the group starts another rebalance."""
    huge = [{"name": "range", "metadata": subscription(TOPIC) + bytes(2 << 20)}]
    joined = join_new_member(broker, "hoarders", protocols=huge)
    assert joined.error_code == ErrorCode.NONE
    (member,) = joined.members
    assert len(member.metadata) == len(huge[0]["metadata"])

    started = time.monotonic()
    synced = sync(
        broker, "hoarders", joined.generation_id, joined.member_id, {member.member_id: b"a"}
    )
    assert synced.error_code == ErrorCode.UNKNOWN_SERVER_ERROR
    assert time.monotonic() - started < TIMEOUT_S / 2
    assert "MESSAGE_TOO_LARGE" in broker.log_tail(200)
    assert group_state(broker, "hoarders") == "PreparingRebalance"
    generation = joined.generation_id
    assert heartbeat(broker, "hoarders", generation, joined.member_id) == (
        ErrorCode.REBALANCE_IN_PROGRESS
    )
    rejoined = join(broker, "hoarders", joined.member_id, protocols=huge)
    assert rejoined.error_code == ErrorCode.NONE
    assert rejoined.generation_id == generation + 1
    assert_serving(broker)


# --- DeleteGroups ------------------------------------------------------------------------------


def test_delete_groups_refuses_busy_and_unknown_groups(broker: BrokerProcess) -> None:
    stable_member(broker, "busy")
    assert commit(broker, "idle", -1, "", {0: (1, "")}) == {0: ErrorCode.NONE}

    deleted = call(broker, ApiKey.DELETE_GROUPS, 2, {"groups_names": ["busy", "never-was", "idle"]})
    assert [(r.group_id, r.error_code) for r in deleted.results] == [
        ("busy", ErrorCode.NON_EMPTY_GROUP),
        ("never-was", ErrorCode.GROUP_ID_NOT_FOUND),
        ("idle", ErrorCode.NONE),
    ]
    assert fetch_offsets(broker, "idle") == {}
    assert group_state(broker, "busy") == "Stable"
    assert_serving(broker)


# --- the consumer protocol (KIP-848) -----------------------------------------------------------


def consumer_heartbeat(
    b: BrokerProcess,
    group: str,
    member_id: str,
    epoch: int,
    *,
    topics: list[str] | None = None,
    assignor: str | None = None,
    version: int = 1,
) -> Any:
    """A ConsumerGroupHeartbeat; ``topics`` None keeps the subscription (and the rebalance
    timeout) unchanged, as a steady heartbeat does."""
    return call(
        b,
        ApiKey.CONSUMER_GROUP_HEARTBEAT,
        version,
        {
            "group_id": group,
            "member_id": member_id,
            "member_epoch": epoch,
            "rebalance_timeout": 30_000 if topics is not None else -1,
            "subscribed_topic_names": topics,
            "server_assignor": assignor,
            "topic_partitions": [] if epoch == 0 else None,
        },
    )


def test_consumer_group_heartbeat_errors(broker: BrokerProcess) -> None:
    member = str(uuid.uuid4())
    unsupported = consumer_heartbeat(broker, "modern", member, 0, topics=[TOPIC], assignor="sticky")
    assert unsupported.error_code == ErrorCode.UNSUPPORTED_ASSIGNOR
    assert unsupported.error_message and "sticky" in unsupported.error_message

    joined = consumer_heartbeat(broker, "modern", member, 0, topics=[TOPIC], assignor="range")
    assert joined.error_code == ErrorCode.NONE
    assert (joined.member_id, joined.member_epoch) == (member, 1)
    assert joined.assignment is not None
    assert [sorted(t.partitions) for t in joined.assignment.topic_partitions] == [[0, 1]]

    ahead = consumer_heartbeat(broker, "modern", member, 2)
    assert ahead.error_code == ErrorCode.FENCED_MEMBER_EPOCH
    stranger = consumer_heartbeat(broker, "modern", str(uuid.uuid4()), 1)
    assert stranger.error_code == ErrorCode.UNKNOWN_MEMBER_ID

    steady = consumer_heartbeat(broker, "modern", member, 1)
    assert (steady.error_code, steady.member_epoch) == (ErrorCode.NONE, 1)
    assert_serving(broker)


def test_consumer_group_heartbeat_v1_needs_a_client_member_id(broker: BrokerProcess) -> None:
    """KIP-1082: from v1 the client makes the member id; Kafka refuses an empty one."""
    anonymous = consumer_heartbeat(broker, "self-named", "", 0, topics=[TOPIC], version=1)
    assert anonymous.error_code == ErrorCode.INVALID_REQUEST, (
        "BROKER BUG: ConsumerGroupHeartbeat v1 with member_id='' answered "
        f"{ErrorCode(anonymous.error_code).name} (member id {anonymous.member_id!r}); Kafka "
        "answers INVALID_REQUEST 'MemberId can't be empty.'"
    )
    # v0 still lets the broker pick
    picked = consumer_heartbeat(broker, "self-named", "", 0, topics=[TOPIC], version=0)
    assert picked.error_code == ErrorCode.NONE and picked.member_id
    assert_serving(broker)


def test_offset_commit_with_a_stale_member_epoch(broker: BrokerProcess) -> None:
    member = str(uuid.uuid4())
    joined = consumer_heartbeat(broker, "epochs", member, 0, topics=[TOPIC])
    assert (joined.error_code, joined.member_epoch) == (ErrorCode.NONE, 1)
    # a new subscription moves the group, and the member, to epoch 2
    moved = consumer_heartbeat(broker, "epochs", member, 1, topics=[TOPIC, "elsewhere"])
    assert (moved.error_code, moved.member_epoch) == (ErrorCode.NONE, 2)

    stale = commit(broker, "epochs", 1, member, {0: (4, "")}, version=9)
    assert stale == {0: ErrorCode.STALE_MEMBER_EPOCH}
    stranger = commit(broker, "epochs", 2, str(uuid.uuid4()), {0: (4, "")}, version=9)
    assert stranger == {0: ErrorCode.UNKNOWN_MEMBER_ID}
    assert commit(broker, "epochs", 2, member, {0: (4, "")}, version=9) == {0: ErrorCode.NONE}
    # v9 to a group that does not exist, with a member epoch: the group is not found
    missing = commit(broker, "never-made", 3, member, {0: (4, "")}, version=9)
    assert missing == {0: ErrorCode.GROUP_ID_NOT_FOUND}

    fetched = call(
        broker,
        ApiKey.OFFSET_FETCH,
        9,
        {
            "groups": [
                {
                    "group_id": "epochs",
                    "member_id": member,
                    "member_epoch": 1,
                    "topics": [{"name": TOPIC, "partition_indexes": [0]}],
                }
            ]
        },
    )
    assert [g.error_code for g in fetched.groups] == [ErrorCode.STALE_MEMBER_EPOCH]
    assert fetched.groups[0].topics == ()  # from v2 a group's error comes alone
    assert fetch_offsets(broker, "epochs") == {0: (4, "")}
    assert_serving(broker)


def test_a_heartbeat_makes_a_group_only_by_joining(broker: BrokerProcess) -> None:
    """As Kafka's getOrMaybeCreateConsumerGroup: a refused join leaves no group behind (none
    to list), and a heartbeat with an epoch to a group that does not exist is
    GROUP_ID_NOT_FOUND."""
    member = str(uuid.uuid4())
    refused = consumer_heartbeat(broker, "unmade", member, 0, topics=[TOPIC], assignor="sticky")
    assert refused.error_code == ErrorCode.UNSUPPORTED_ASSIGNOR
    listed = call(broker, ApiKey.LIST_GROUPS, 5, {})
    assert "unmade" not in {g.group_id for g in listed.groups}
    later = consumer_heartbeat(broker, "unmade", member, 3)
    assert (later.error_code, later.error_message) == (
        ErrorCode.GROUP_ID_NOT_FOUND,
        "Consumer group unmade not found.",
    )
    assert_serving(broker)


def test_a_member_joining_again_under_its_id_keeps_its_partitions(broker: BrokerProcess) -> None:
    """A member that joins again with epoch 0 and its own id (its first answer was lost) is
    answered its assignment in full and keeps it: the partitions were left to nobody."""
    member = str(uuid.uuid4())
    joined = consumer_heartbeat(broker, "again", member, 0, topics=[TOPIC])
    assert (joined.error_code, joined.member_epoch) == (ErrorCode.NONE, 1)
    again = consumer_heartbeat(broker, "again", member, 0, topics=[TOPIC])
    assert (again.error_code, again.member_epoch) == (ErrorCode.NONE, 1)
    assert again.assignment is not None
    assert [sorted(t.partitions) for t in again.assignment.topic_partitions] == [[0, 1]]
    described = call(
        broker,
        ApiKey.CONSUMER_GROUP_DESCRIBE,
        0,
        {"group_ids": ["again"], "include_authorized_operations": False},
    )
    (only,) = described.groups[0].members
    assert [sorted(t.partitions) for t in only.assignment.topic_partitions] == [[0, 1]]
    assert_serving(broker)


def test_a_commit_of_an_unknown_partition_is_answered_before_the_group(
    broker: BrokerProcess,
) -> None:
    """As Kafka's KafkaApis: a partition that does not exist is UNKNOWN_TOPIC_OR_PARTITION
    whatever the group would say of the commit, and a commit of nothing that exists does not
    ask the group at all (no GROUP_ID_NOT_FOUND, no group made)."""
    member, generation = stable_member(broker, "unknown-parts")
    mixed = commit(broker, "unknown-parts", generation + 1, member, {0: (1, ""), 5: (1, "")})
    assert mixed == {0: ErrorCode.ILLEGAL_GENERATION, 5: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    nowhere = commit(broker, "never-asked", 3, member, {5: (1, "")}, version=9)
    assert nowhere == {5: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    listed = call(broker, ApiKey.LIST_GROUPS, 5, {})
    assert "never-asked" not in {g.group_id for g in listed.groups}
    assert_serving(broker)


def test_sync_group_v5_needs_its_protocol_type_and_name(broker: BrokerProcess) -> None:
    member, generation = stable_member(broker, "named-protocol")
    unnamed = sync(broker, "named-protocol", generation, member, protocol_type=None)
    assert unnamed.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert_serving(broker)


def test_offset_commits_keep_a_member_s_session_alive(make_broker: MakeBroker) -> None:
    """Kafka's validateOffsetCommit reschedules the member's heartbeat: a member that commits
    but sends no heartbeat within its session timeout stays in the group."""
    b = with_orders_topic(
        make_broker(
            **{"group.initial.rebalance.delay.ms": "0", "group.min.session.timeout.ms": "500"}
        )
    )
    member, generation = stable_member(b, "committing", session_ms=2000)
    for offset in range(8):  # 3.2 s, past the session timeout
        time.sleep(0.4)
        assert commit(b, "committing", generation, member, {0: (offset, "")}) == {0: ErrorCode.NONE}
    assert heartbeat(b, "committing", generation, member) == ErrorCode.NONE
    assert group_state(b, "committing") == "Stable"


def test_group_max_size_is_checked_as_kafkas_accept_joining_member(
    make_broker: MakeBroker,
) -> None:
    """Kafka's acceptJoiningMember: an empty group takes any join (member ids handed out
    with MEMBER_ID_REQUIRED do not count); a full group refuses a newcomer
    GROUP_MAX_SIZE_REACHED, with no member id."""
    b = with_orders_topic(
        make_broker(
            **{
                "group.initial.rebalance.delay.ms": "0",
                "group.max.size": "1",
                "group.min.session.timeout.ms": "500",
            }
        )
    )
    # (a short session: the join waits for the other handed-out id to expire)
    first, second = join(b, "one-only", session_ms=800), join(b, "one-only", session_ms=800)
    assert first.error_code == second.error_code == ErrorCode.MEMBER_ID_REQUIRED
    joined = join(b, "one-only", first.member_id, session_ms=800)
    assert joined.error_code == ErrorCode.NONE
    refused = join(b, "one-only", second.member_id, session_ms=800)
    assert (refused.error_code, refused.member_id) == (ErrorCode.GROUP_MAX_SIZE_REACHED, "")
    assert_serving(b)


def test_a_classic_group_of_consumers_becomes_a_consumer_protocol_group(
    broker: BrokerProcess,
) -> None:
    """KIP-848's online upgrade, request by request: a classic group of another protocol type,
    or whose assignment is not the consumer protocol's, stays classic, with Kafka's reason; a
    classic group of consumers becomes a consumer-protocol group when a member of that
    protocol joins, its classic member described as such (ConsumerGroupDescribe v1) and told
    to rejoin; DescribeGroups sees it Dead, as Kafka's."""
    joined = join_new_member(broker, "workers", protocol_type="connect")
    sync(broker, "workers", joined.generation_id, joined.member_id, protocol_type="connect")
    refused = consumer_heartbeat(broker, "workers", str(uuid.uuid4()), 0, topics=[TOPIC])
    assert (refused.error_code, refused.error_message) == (
        ErrorCode.GROUP_ID_NOT_FOUND,
        "Cannot upgrade classic group workers to consumer group because the group does not "
        "use the consumer embedded protocol.",
    )
    stable_member(broker, "garbled")  # its leader assigned b"all"
    refused = consumer_heartbeat(broker, "garbled", str(uuid.uuid4()), 0, topics=[TOPIC])
    assert refused.error_message == (
        "Cannot upgrade classic group garbled to consumer group because the embedded consumer "
        "protocol is malformed."
    )
    # a heartbeat at an epoch is no join: it converts nothing
    stale = consumer_heartbeat(broker, "garbled", str(uuid.uuid4()), 3, topics=[TOPIC])
    assert (stale.error_code, stale.error_message) == (
        ErrorCode.GROUP_ID_NOT_FOUND,
        "Group garbled is not a consumer group.",
    )

    joined = join_new_member(broker, "upgraded")
    both = serialize_assignment([(TOPIC, [0, 1])])
    synced = sync(
        broker, "upgraded", joined.generation_id, joined.member_id, {joined.member_id: both}
    )
    assert synced.error_code == ErrorCode.NONE
    newcomer = str(uuid.uuid4())
    accepted = consumer_heartbeat(broker, "upgraded", newcomer, 0, topics=[TOPIC])
    assert accepted.error_code == ErrorCode.NONE
    described = call(
        broker,
        ApiKey.CONSUMER_GROUP_DESCRIBE,
        1,
        {"group_ids": ["upgraded"], "include_authorized_operations": False},
    )
    (group,) = described.groups
    assert {m.member_id: m.member_type for m in group.members} == {
        joined.member_id: 0,  # classic
        newcomer: 1,  # consumer
    }
    listed = call(broker, ApiKey.LIST_GROUPS, 5, {"states_filter": [], "types_filter": []})
    assert {(g.group_id, g.group_type) for g in listed.groups} >= {
        ("upgraded", "consumer"),
        ("workers", "classic"),
    }
    # DescribeGroups describes classic groups only: Kafka answers Dead, with no error or members
    (dead,) = call(broker, ApiKey.DESCRIBE_GROUPS, 5, {"groups": ["upgraded"]}).groups
    assert (dead.error_code, dead.group_state, dead.protocol_type, dead.members) == (
        ErrorCode.NONE,
        "Dead",
        "",
        (),
    )
    # the classic member is at its generation, behind the group: it rejoins
    assert heartbeat(broker, "upgraded", joined.generation_id, joined.member_id) == (
        ErrorCode.REBALANCE_IN_PROGRESS
    )
    again = join(broker, "upgraded", joined.member_id)
    assert (again.error_code, again.leader, list(again.members)) == (ErrorCode.NONE, "", [])
    assert again.generation_id == group.group_epoch
    assert_serving(broker)


def test_a_consumer_group_is_described_with_the_topics_that_exist(broker: BrokerProcess) -> None:
    """ConsumerGroupDescribe names each assigned topic as the metadata names it now, and
    leaves out a topic deleted since (Kafka's topicPartitionsFromMap); a group that is not
    there is answered with no state."""
    doomed = f"doomed-{uuid.uuid4().hex[:6]}"
    topic = {"name": doomed, "num_partitions": 1, "replication_factor": 1}
    created = call(broker, ApiKey.CREATE_TOPICS, 5, {"topics": [topic], "timeout": 5000})
    assert [t.error_code for t in created.topics] == [ErrorCode.NONE]
    member = str(uuid.uuid4())
    joined = consumer_heartbeat(broker, "describes", member, 0, topics=[TOPIC, doomed])
    assert joined.error_code == ErrorCode.NONE

    def assigned() -> list[tuple[str, list[int]]]:
        described = call(
            broker,
            ApiKey.CONSUMER_GROUP_DESCRIBE,
            1,
            {"group_ids": ["describes"], "include_authorized_operations": False},
        )
        (group,) = described.groups
        assert group.error_code == ErrorCode.NONE
        (m,) = group.members
        target = m.target_assignment.topic_partitions
        return sorted((t.topic_name, list(t.partitions)) for t in target)

    assert assigned() == [(doomed, [0]), (TOPIC, [0, 1])]
    deleted = call(broker, ApiKey.DELETE_TOPICS, 5, {"topic_names": [doomed], "timeout": 5000})
    assert [r.error_code for r in deleted.responses] == [ErrorCode.NONE]
    assert assigned() == [(TOPIC, [0, 1])]
    (missing,) = call(
        broker,
        ApiKey.CONSUMER_GROUP_DESCRIBE,
        1,
        {"group_ids": ["nobody-here"], "include_authorized_operations": False},
    ).groups
    assert (missing.error_code, missing.group_state) == (ErrorCode.GROUP_ID_NOT_FOUND, "")
    assert_serving(broker)
