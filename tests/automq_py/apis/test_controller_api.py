"""The controller's extension APIs on the real broker process, through ``ControllerClient``.

Each test starts a broker storing in the session's real S3 server, produces records with
confluent-kafka (uploads every 200 ms, small segments), and then reads and commits as the
maintenance jobs do: the image it describes matches the bucket, refused commits come back as
``MetadataError`` on a connection that stays usable, prepared objects expire, segments and
retention settings are reported, DeleteRecords moves the log start. The last tests fuzz the
extension API keys over raw sockets, as ``test_broker_fuzz`` does for Kafka's.
"""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import given, note, settings
from hypothesis import strategies as st

from protocol import extensions as ext
from protocol.api_keys import ApiKey
from spark_jobs.controller_client import ControllerClient, ControllerError
from storage.metadata.image import MetadataImage
from storage.metadata.model import (
    CommitRange,
    CommitStreamObject,
    ErrorCode,
    MetadataError,
    ObjectState,
)
from storage.metadata.records import OBJECT_ID_COUNTER
from storage.object_format import namespace_for_cluster, object_key
from storage.operator import open_object_store
from storage.retention import RetentionPolicy
from tests.automq_py.conftest import MakeBroker
from tests.automq_py.network.test_broker_fuzz import (
    FUZZ,
    INT32S,
    assert_serving,
    create_fuzz_topic,
    exchange,
    frame,
    mutated_frames,
    request,
)
from tests.support.broker import BrokerProcess
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

TOPIC = "ctl"
PARTITIONS = 2
RECORDS = 400  # per partition
RETENTION_MS = 3_600_000
NODE = 0  # the broker's node.id
INVALID_REQUEST, UNKNOWN_TOPIC_OR_PARTITION = 42, 3
SETTLE_TIMEOUT_S = 30.0
NO_SUCH_OBJECT = 1 << 40
# the broker's own compaction/retention/GC would change the metadata under the assertions (and
# its Spark child competes for the CPU with a long fuzz run): these tests are the only client
NO_MAINTENANCE = {"s3.maintenance.runner": "none"}


class Produced:
    """What the fixture wrote: per partition, the record count and the largest timestamp."""

    def __init__(self, broker: BrokerProcess, max_timestamps: dict[int, int]) -> None:
        self.broker = broker
        self.max_timestamps = max_timestamps

    @property
    def cluster_id(self) -> str:
        return self.broker.overrides["cluster.id"]


@pytest.fixture
def produced(make_broker: MakeBroker) -> Produced:
    broker = make_broker(**{"s3.wal.upload.interval.ms": "200", **NO_MAINTENANCE})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = NewTopic(
        TOPIC,
        PARTITIONS,
        1,
        config={"retention.ms": str(RETENTION_MS), "segment.bytes": "16384"},
    )
    for future in admin.create_topics([topic]).values():
        future.result(15)
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": "all",
            "linger.ms": 0,
            "batch.num.messages": 10,
            "enable.idempotence": False,
        }
    )
    base_ts = int(time.time() * 1000) - 10_000
    max_ts: dict[int, int] = {}
    for i in range(RECORDS * PARTITIONS):
        p, ts = i % PARTITIONS, base_ts + i
        producer.produce(TOPIC, b"v" * 200, b"k%d" % i, partition=p, timestamp=ts)
        max_ts[p] = ts
        if i % 50 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    return Produced(broker, max_ts)


async def settled_image(client: ControllerClient) -> MetadataImage:
    """The image once uploads stopped: no PREPARED object, the same objects twice in a row."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    previous: dict[int, Any] = {}
    while True:
        image, _ = await client.describe_s3_metadata()
        objects = dict(image.objects)
        settled = (
            objects == previous
            and any(n.stream_set_objects for n in image.nodes.values())
            and all(o.state is not ObjectState.PREPARED for o in objects.values())
        )
        if settled:
            return image
        assert time.monotonic() < deadline, f"metadata did not settle: {objects}"
        previous = objects
        await asyncio.sleep(0.5)


async def bucket_objects(s3_server: SeaweedFS, namespace: str) -> dict[int, int]:
    """object id -> size of the bucket's objects under ``namespace``."""
    store = open_object_store(s3_server.url())
    try:
        out = {}
        async for info in store.list():
            if f"/{namespace}/" in info.key:
                object_id = int(info.key.rsplit("/", 1)[1])
                assert info.key == object_key(namespace, object_id)
                out[object_id] = info.size
        return out
    finally:
        await store.close()


# -- reads ------------------------------------------------------------------------------------


async def test_describe_s3_metadata_matches_the_bucket(
    produced: Produced, s3_server: SeaweedFS
) -> None:
    async with await ControllerClient.connect(produced.broker.bootstrap) as client:
        image = await settled_image(client)
        _, now = await client.describe_s3_metadata()
    assert abs(now - time.time() * 1000) < 60_000
    # each partition has a MetaStream, a log stream and a time index stream
    assert len(image.streams) >= 3 * PARTITIONS
    node = image.nodes[NODE]
    assert node.epoch == 1 and not node.failover and node.stream_set_objects
    committed = {
        o.object_id: o.object_size
        for o in image.objects.values()
        if o.state is ObjectState.COMMITTED
    }
    for sso in node.stream_set_objects:
        assert sso.object_id in committed and sso.object_size == committed[sso.object_id]
    assert await bucket_objects(s3_server, namespace_for_cluster(produced.cluster_id)) == committed
    assert image.next_id(OBJECT_ID_COUNTER) > max(committed)
    # the rebuilt image answers the read path's lookups: every stream is wholly in objects
    log_ends = []
    for s in image.streams.values():
        assert s.owner == NODE
        found = image.get_objects(s.stream_id, s.start_offset, -1, 10_000)
        covered = found[-1].end_offset if found else s.start_offset
        assert covered == s.end_offset, (s, found)
        log_ends.append(s.end_offset)
    # the log streams count records: one per partition holds all its records
    assert log_ends.count(RECORDS) >= PARTITIONS


async def test_describe_streams_and_get_kvs(produced: Produced) -> None:
    """AutoMQ's DescribeStreams places each stream in its partition; GetKVs reads the
    partition's MetaStream id under AutoMQ's namespace."""
    port = produced.broker.port
    body = call(
        port,
        ApiKey.DESCRIBE_STREAMS,
        0,
        {"topic_partitions": [{"topic_name": TOPIC, "partitions": [{"partition_index": 1}]}]},
    )
    assert body["error_code"] == 0
    streams = body["stream_metadata_list"]
    assert len(streams) == 3
    assert {(s["topic_name"], s["partition_index"], s["state"], s["node_id"]) for s in streams} == {
        (TOPIC, 1, "OPENED", NODE)
    }
    topic_id = streams[0]["topic_id"]
    assert topic_id != uuid.UUID(int=0)
    every = call(port, ApiKey.DESCRIBE_STREAMS, 0, {})["stream_metadata_list"]
    assert {s["stream_id"] for s in streams} < {s["stream_id"] for s in every}
    one = call(port, ApiKey.DESCRIBE_STREAMS, 0, {"stream_id": streams[0]["stream_id"]})
    [again] = one["stream_metadata_list"]
    # uploads still commit every 200 ms: the stream's committed end may only have moved on
    assert again["end_offset"] >= streams[0]["end_offset"]
    assert {**again, "end_offset": None} == {**streams[0], "end_offset": None}

    namespace = namespace_for_cluster(produced.cluster_id)
    kvs = call(
        port,
        ApiKey.GET_KVS,
        1,
        {
            "get_key_requests": [
                {"key": f"{topic_id}/1", "namespace": namespace},
                {"key": "no/such/key", "namespace": ""},
            ]
        },
    )
    found, missing = kvs["get_kv_responses"]
    assert found["error_code"] == 0 and len(found["value"]) == 8
    (meta_stream_id,) = struct.unpack(">q", found["value"])
    assert meta_stream_id in {s["stream_id"] for s in streams}
    assert missing == {"error_code": 0, "value": None}


def call(port: int, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
    """One extension request on a new connection, answered."""
    payload = ext.encode_request(api_key, version, 5, body, "test")[4:]
    correlation_id, answer = ext.decode_response(api_key, version, request(port, payload))
    assert correlation_id == 5
    return answer


# -- commits ----------------------------------------------------------------------------------


async def test_prepare_objects_and_refused_commits(produced: Produced) -> None:
    async with await ControllerClient.connect(produced.broker.bootstrap) as client:
        image = await settled_image(client)
        first = await client.prepare_objects(2, 60_000)
        assert first >= image.next_id(OBJECT_ID_COUNTER)
        assert await client.prepare_objects(1, 60_000) == first + 2
        sso = image.nodes[NODE].stream_set_objects[0]

        # a compaction naming an object that does not exist
        with pytest.raises(MetadataError) as refused:
            await client.commit_stream_set_object(
                NODE, 1, first, sso.order_id, 100, [], [], [NO_SUCH_OBJECT]
            )
        assert refused.value.code is ErrorCode.COMPACTED_OBJECTS_NOT_FOUND
        # an epoch from the node's previous life
        with pytest.raises(MetadataError) as refused:
            await client.commit_stream_set_object(NODE, 0, first, sso.order_id, 100, [], [], [])
        assert refused.value.code is ErrorCode.NODE_EPOCH_EXPIRED
        # an upload that does not continue the stream at its end offset
        stream = image.streams[sso.ranges[0].stream_id]
        with pytest.raises(MetadataError) as refused:
            await client.commit_stream_set_object(
                NODE,
                1,
                first,
                first,
                100,
                [
                    CommitRange(
                        stream.stream_id, stream.epoch, stream.end_offset + 5, stream.end_offset + 9
                    )
                ],
                [],
                [],
            )
        assert refused.value.code is ErrorCode.OFFSET_NOT_MATCHED
        # a malformed commit (the same id twice) is INVALID_REQUEST, not a metadata code
        with pytest.raises(ControllerError) as invalid:
            await client.commit_stream_set_object(
                NODE,
                1,
                first,
                first,
                100,
                [],
                [CommitStreamObject(first, stream.stream_id, 0, 1, 10)],
                [],
            )
        assert invalid.value.code == INVALID_REQUEST
        # merging stream objects that are not the stream's
        with pytest.raises(MetadataError) as refused:
            await client.commit_stream_object(
                first + 1, stream.stream_id, -1, 0, 1, 10, [NO_SUCH_OBJECT]
            )
        assert refused.value.code is ErrorCode.COMPACTED_OBJECTS_NOT_FOUND
        with pytest.raises(ControllerError) as invalid:
            await client.prepare_objects(0, 60_000)
        assert invalid.value.code == INVALID_REQUEST

        # the connection is still good, and nothing changed but the prepared objects
        after, _ = await client.describe_s3_metadata()
        assert after.streams == image.streams and after.nodes == image.nodes
        assert {after.objects[i].state for i in range(first, first + 3)} == {ObjectState.PREPARED}

        # a large answer (thousands of objects, far more than one socket read) arrives whole
        many = await client.prepare_objects(5000, 60_000)
        after, _ = await client.describe_s3_metadata()
        assert all(after.objects[i].state is ObjectState.PREPARED for i in range(many, many + 5000))
        assert after.next_id(OBJECT_ID_COUNTER) == many + 5000


async def test_expire_and_destroy_prepared_objects(produced: Produced) -> None:
    async with await ControllerClient.connect(produced.broker.bootstrap) as client:
        image = await settled_image(client)
        doomed = await client.prepare_objects(1, 1)
        kept = await client.prepare_objects(1, 600_000)
        await asyncio.sleep(0.05)
        assert await client.expire_prepared_objects() == [doomed]
        image, _ = await client.describe_s3_metadata()
        assert image.objects[doomed].state is ObjectState.MARK_DESTROYED
        assert image.objects[doomed].mark_destroyed_ms is not None
        assert image.objects[kept].state is ObjectState.PREPARED
        assert image.objects[kept].committed_ms is None
        assert await client.expire_prepared_objects() == []

        await client.destroy_objects([doomed])
        image, _ = await client.describe_s3_metadata()
        assert doomed not in image.objects
        await client.destroy_objects([doomed])  # a retry is fine
        # a committed object is not marked for deletion: refused
        committed = next(o for o in image.objects.values() if o.state is ObjectState.COMMITTED)
        with pytest.raises(MetadataError) as refused:
            await client.destroy_objects([committed.object_id])
        assert refused.value.code is ErrorCode.STREAM_INNER_ERROR
        with pytest.raises(MetadataError) as refused:
            await client.destroy_objects([NO_SUCH_OBJECT])
        assert refused.value.code is ErrorCode.OBJECT_NOT_EXIST


# -- partitions -------------------------------------------------------------------------------


async def test_describe_log_segments_and_delete_records(produced: Produced) -> None:
    async with await ControllerClient.connect(produced.broker.bootstrap) as client:
        logs, now = await client.describe_log_segments([TOPIC])
        assert abs(now - time.time() * 1000) < 60_000
        assert [(p.topic, p.partition) for p in logs] == [(TOPIC, 0), (TOPIC, 1)]
        for p in logs:
            assert p.policy == RetentionPolicy(("delete",), RETENTION_MS, -1)
            assert (p.log_start_offset, p.log_end_offset) == (0, RECORDS)
            # 16 KiB segments: the records span several, back to back
            assert len(p.segments) >= 2
            assert p.segments[0].base_offset == 0 and p.segments[-1].next_offset == RECORDS
            for a, b in zip(p.segments, p.segments[1:], strict=False):
                assert a.next_offset == b.base_offset
            assert all(s.size > 0 for s in p.segments if s.next_offset > s.base_offset)
            assert max(s.max_timestamp for s in p.segments) == produced.max_timestamps[p.partition]
            # the first batch's timestamp (max.compaction.lag.ms measures a segment's age by it)
            written = [s for s in p.segments if s.next_offset > s.base_offset]
            assert all(0 < s.first_batch_timestamp <= s.max_timestamp for s in written)
        everything, _ = await client.describe_log_segments()
        assert {(p.topic, p.partition) for p in everything} >= {(TOPIC, 0), (TOPIC, 1)}
        unknown, _ = await client.describe_log_segments(["no-such-topic"])
        assert unknown == []

        answers = await client.delete_records({(TOPIC, 0): 150, ("no-such-topic", 0): 1})
        assert answers == {
            (TOPIC, 0): (0, 150),
            ("no-such-topic", 0): (UNKNOWN_TOPIC_OR_PARTITION, -1),
        }
        logs, _ = await client.describe_log_segments([TOPIC])
        assert logs[0].log_start_offset == 150 and logs[1].log_start_offset == 0
        # whole segments below the new start left the log
        assert logs[0].segments[0].next_offset > 150


async def test_describe_log_segments_for_a_cleanup_policy(produced: Produced) -> None:
    """Only the topics whose policy has the one asked for, from a v1 broker (which skips the
    others before opening them) and, by the client's own filter, from a v0 one."""
    compact = f"ctl-compact-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": produced.broker.bootstrap})
    new = NewTopic(compact, 1, 1, config={"cleanup.policy": "compact"})
    await asyncio.to_thread(admin.create_topics([new])[compact].result, 15)
    async with await ControllerClient.connect(produced.broker.bootstrap) as client:
        for version in (1, 0):
            client._versions[ApiKey.DESCRIBE_LOG_SEGMENTS] = (0, version)
            compacted, _ = await client.describe_log_segments(cleanup_policy="compact")
            assert all(p.policy.compacts for p in compacted)
            assert (compact, 0) in {(p.topic, p.partition) for p in compacted}
            assert TOPIC not in {p.topic for p in compacted}
            deleting, _ = await client.describe_log_segments([TOPIC], cleanup_policy="delete")
            assert [(p.topic, p.partition) for p in deleting] == [(TOPIC, 0), (TOPIC, 1)]
            # a v0 answer has no lags: Kafka's defaults
            assert deleting[0].policy.min_compaction_lag_ms == 0
            assert deleting[0].policy.max_compaction_lag_ms == (1 << 63) - 1


async def test_a_dead_connection_raises_connection_error(produced: Produced) -> None:
    client = await ControllerClient.connect(produced.broker.bootstrap, timeout_s=10)
    await client.describe_s3_metadata()
    produced.broker.kill()
    with pytest.raises(ConnectionError):
        await client.describe_s3_metadata()
    with pytest.raises(ConnectionError):
        await client.prepare_objects(1, 1000)
    await client.close()
    with pytest.raises(OSError):
        await ControllerClient.connect(produced.broker.bootstrap, timeout_s=5)


# -- fuzzing ----------------------------------------------------------------------------------


def _extension_payloads() -> list[bytes]:
    """Well-formed requests of every extension API (header + body, no size prefix)."""
    requests: list[tuple[int, int, dict[str, Any]]] = [
        (
            ApiKey.PREPARE_S3_OBJECT,
            0,
            {"node_id": 0, "prepared_count": 1, "time_to_live_in_ms": 1000},
        ),
        (
            ApiKey.COMMIT_STREAM_SET_OBJECT,
            1,
            {
                "node_id": 0,
                "node_epoch": 1,
                "object_id": NO_SUCH_OBJECT,
                "order_id": NO_SUCH_OBJECT,
                "object_size": 10,
                "object_stream_ranges": [
                    {"stream_id": 0, "stream_epoch": 1, "start_offset": 0, "end_offset": 1}
                ],
                "stream_objects": [
                    {
                        "object_id": NO_SUCH_OBJECT + 1,
                        "object_size": 10,
                        "stream_id": 1,
                        "start_offset": 0,
                        "end_offset": 1,
                    }
                ],
                "compacted_object_ids": [NO_SUCH_OBJECT + 2],
            },
        ),
        (
            ApiKey.COMMIT_STREAM_OBJECT,
            0,
            {
                "object_id": NO_SUCH_OBJECT,
                "object_size": 10,
                "stream_id": NO_SUCH_OBJECT,  # the topic's partitions opened streams 0-8
                "start_offset": 0,
                "end_offset": 1,
                "source_object_ids": [NO_SUCH_OBJECT + 1],
                "stream_epoch": -1,
            },
        ),
        (ApiKey.GET_KVS, 1, {"get_key_requests": [{"key": "k", "namespace": "ns"}]}),
        (
            ApiKey.DESCRIBE_STREAMS,
            0,
            {"topic_partitions": [{"topic_name": "fuzz", "partitions": [{"partition_index": 0}]}]},
        ),
        (ApiKey.DESCRIBE_S3_METADATA, 0, {}),
        (ApiKey.EXPIRE_PREPARED_OBJECTS, 0, {}),
        (ApiKey.DESTROY_S3_OBJECTS, 0, {"object_ids": [NO_SUCH_OBJECT]}),
        (ApiKey.DESCRIBE_LOG_SEGMENTS, 0, {"topics": ["fuzz"]}),
    ]
    return [
        ext.encode_request(key, version, n + 1, body, "fuzz")[4:]
        for n, (key, version, body) in enumerate(requests)
    ]


EXTENSION_PAYLOADS = _extension_payloads()


@pytest.fixture
def controller_fuzz_broker(make_broker: MakeBroker) -> BrokerProcess:
    broker = make_broker(**NO_MAINTENANCE)
    create_fuzz_topic(broker)
    return broker


def test_extension_requests_are_answered(controller_fuzz_broker: BrokerProcess) -> None:
    """Each seed gets one well-formed answer with its correlation id: the commits and the
    DestroyS3Objects name objects (and a stream) that do not exist."""
    refused = {
        ApiKey.COMMIT_STREAM_SET_OBJECT: ErrorCode.OBJECT_NOT_EXIST,
        ApiKey.COMMIT_STREAM_OBJECT: ErrorCode.STREAM_NOT_EXIST,
        ApiKey.DESTROY_S3_OBJECTS: ErrorCode.OBJECT_NOT_EXIST,
    }
    for payload in EXTENSION_PAYLOADS:
        api_key, version, correlation_id = struct.unpack_from(">hhi", payload)
        response = request(controller_fuzz_broker.port, payload)
        answered, body = ext.decode_response(api_key, version, response)
        assert answered == correlation_id
        expected = refused.get(api_key, 0)
        assert body["error_code"] == expected, api_key
    assert_serving(controller_fuzz_broker)


HEADER_BYTES = 8 + 2 + len("fuzz") + 1  # ids, client id, empty tagged fields


@st.composite
def mutated_bodies(draw: st.DrawFn) -> bytes:
    """A seed with its header kept and its body mutated 1-4 times, so that the mutations reach
    the extension decoder and the handlers rather than stopping at the header."""
    seed = draw(st.sampled_from(EXTENSION_PAYLOADS))
    body = bytearray(seed[HEADER_BYTES:])
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "int64", "int32", "byte", "insert"]))
        pos = draw(st.integers(0, max(len(body) - 1, 0)))
        if kind == "flip" and body:
            body[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del body[pos:]
        elif kind == "int64" and pos + 8 <= len(body):
            value = draw(st.sampled_from([-1, 0, 1, (1 << 63) - 1, -(1 << 63), 1 << 32]))
            struct.pack_into(">q", body, pos, value)
        elif kind == "int32" and pos + 4 <= len(body):
            struct.pack_into(">i", body, pos, draw(st.sampled_from(INT32S)))
        elif kind == "byte" and body:
            body[pos] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]))
        elif kind == "insert":
            body[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    return frame(seed[:HEADER_BYTES] + bytes(body))


@settings(FUZZ, max_examples=300)
@given(data=st.one_of(mutated_frames(EXTENSION_PAYLOADS), mutated_bodies()))
def test_mutated_extension_requests_do_not_break_the_broker(
    controller_fuzz_broker: BrokerProcess, data: bytes
) -> None:
    note(f"frame: {data.hex()}")
    exchange(controller_fuzz_broker.port, data)
    assert_serving(controller_fuzz_broker)
    # the controller APIs still answer too (one stream asked for: a whole-image dump would cost
    # a second per example once a mutated PrepareS3Object was accepted, 100,000 objects)
    answer = call(controller_fuzz_broker.port, ApiKey.DESCRIBE_STREAMS, 0, {"stream_id": 0})
    assert answer["error_code"] == 0


def test_absurd_prepare_counts_are_refused(controller_fuzz_broker: BrokerProcess) -> None:
    """2**31 - 1 ids would be one record each in one transaction: refused, not attempted."""
    for count, ttl in ((0x7FFFFFFF, 1000), (1, (1 << 63) - 1), (-1, 1000), (1, -1)):
        body = {"node_id": 0, "prepared_count": count, "time_to_live_in_ms": ttl}
        answer = call(controller_fuzz_broker.port, ApiKey.PREPARE_S3_OBJECT, 0, body)
        assert answer["error_code"] == INVALID_REQUEST, (count, ttl)
    assert_serving(controller_fuzz_broker)
