"""The controller's extension APIs (``protocol.extensions``): how maintenance jobs read stream
and object metadata and commit their work through this broker, never to the database itself.

=====  ======================  ==============================================================
key    API                     what it does
=====  ======================  ==============================================================
505    PrepareS3Object         ``MetadataManager.prepare_object``: reserve object ids
                               (at most ``MAX_PREPARED_COUNT`` a request)
506    CommitStreamSetObject   ``commit_stream_set_object`` (uploads and SSO compactions)
507    CommitStreamObject      ``commit_stream_object`` (Stream Object merges)
509    GetKVs                  ``get_kv`` per key (a namespace ``ns`` reads ``ns/key``)
601    DescribeStreams         the streams, with the partition owning each where known
1000   DescribeS3Metadata      the image's streams, nodes, objects and next object id
1001   ExpirePreparedObjects   ``expire_prepared``: PREPARED past deadline -> MARK_DESTROYED
1002   DestroyS3Objects        ``mark_destroyed_done``: these objects are gone from storage
1003   DescribeLogSegments     each partition's segments and its topic's effective retention
                               and compaction settings (v1: of the topics whose cleanup.policy
                               has the one asked for, if any)
1004   CommitCleanedSegment    ``ElasticLog.replace_with_cleaned``: key compaction's output
                               replaces sealed segments (CleanedSegmentError: INVALID_REQUEST
                               with the reason, e.g. the segments changed meanwhile)
=====  ======================  ==============================================================

They are what brokers and their maintenance jobs send: each needs CLUSTER_ACTION on the cluster
(CLUSTER_AUTHORIZATION_FAILED), as Kafka's inter-broker APIs do.

Errors are answered, never raised to the network layer: a refused metadata operation
(``MetadataError``) answers its AutoMQ code (501-512, 599) as ``error_code``, a malformed
request (``ValueError`` from ``storage.metadata.control``) INVALID_REQUEST, anything else
UNKNOWN_SERVER_ERROR, with the exception logged. The connection stays open either way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from automq_py.apis.context import BrokerContext
from automq_py.log.elastic_log import CleanedBatch, CleanedSegmentError
from automq_py.log.log_loader import STREAM_ID, meta_stream_key
from automq_py.log.txn_index import AbortedTxn
from automq_py.security.acls import AclOperation
from automq_py.topics import TopicInfo
from protocol import extensions as ext
from protocol import wire
from protocol.api_keys import ApiKey
from protocol.build import ZERO_UUID
from protocol.errors import ErrorCode
from protocol.messages import Request
from storage.metadata.model import CommitRange, CommitStreamObject, MetadataError
from storage.metadata.records import OBJECT_ID_COUNTER

log = logging.getLogger("automq.apis.controller")

Body = dict[str, Any]
Answer = Callable[[BrokerContext, Body, int], Awaitable[Body]]

MAX_PREPARED_COUNT = 100_000
MAX_TTL_MS = 1 << 62  # so that now + ttl (the deadline) fits in an int64
NO_NODE = -1
NO_PARTITION = -1
NO_TIME = -1


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _handler(api_key: int, answer: Answer) -> Callable[[BrokerContext, Request], Awaitable[Any]]:
    """Wrap ``answer`` (request body -> response body) with the encoding and error answers."""
    name = ext.MESSAGES[api_key].name

    async def handle(ctx: BrokerContext, request: Request) -> list[wire.Buffer]:
        version, correlation_id = request.api_version, request.correlation_id
        try:
            if ctx.allowed_on_cluster(AclOperation.CLUSTER_ACTION):
                body = await answer(ctx, request.body, version)
            else:
                body = {"error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED}
        except MetadataError as e:
            log.info("%s refused: %s", name, e)
            body = {"error_code": int(e.code)}
        except ValueError as e:
            log.info("%s: invalid request: %s", name, e)
            body = {"error_code": ErrorCode.INVALID_REQUEST}
        except Exception:
            log.exception("%s failed", name)
            body = {"error_code": ErrorCode.UNKNOWN_SERVER_ERROR}
        try:
            return [ext.encode_response(api_key, version, correlation_id, body)]
        except ValueError:
            log.exception("%s: cannot encode the response", name)
            error = {"error_code": ErrorCode.UNKNOWN_SERVER_ERROR}
            return [ext.encode_response(api_key, version, correlation_id, error)]

    return handle


# -- objects ----------------------------------------------------------------------------------


async def prepare_s3_object(ctx: BrokerContext, body: Body, version: int) -> Body:
    count, ttl_ms = body["prepared_count"], body["time_to_live_in_ms"]
    # one record per id, written in one transaction: 2**31 of them would exhaust the broker
    if count > MAX_PREPARED_COUNT:
        raise ValueError(f"prepared_count {count} is above {MAX_PREPARED_COUNT}")
    if ttl_ms > MAX_TTL_MS:
        raise ValueError(f"time_to_live_in_ms {ttl_ms} is above {MAX_TTL_MS}")
    first = await ctx.replicas.storage.metadata.prepare_object(count, ttl_ms)
    return {"first_s3_object_id": first}


async def commit_stream_set_object(ctx: BrokerContext, body: Body, version: int) -> Body:
    ranges = [
        CommitRange(r["stream_id"], r["stream_epoch"], r["start_offset"], r["end_offset"])
        for r in body["object_stream_ranges"]
    ]
    stream_objects = [
        CommitStreamObject(
            o["object_id"], o["stream_id"], o["start_offset"], o["end_offset"], o["object_size"]
        )
        for o in body["stream_objects"]
    ]
    await ctx.replicas.storage.metadata.commit_stream_set_object(
        body["node_id"],
        body["node_epoch"],
        body["object_id"],
        body["order_id"],
        body["object_size"],
        ranges,
        stream_objects,
        body["compacted_object_ids"],
    )
    return {}


async def commit_stream_object(ctx: BrokerContext, body: Body, version: int) -> Body:
    await ctx.replicas.storage.metadata.commit_stream_object(
        body["object_id"],
        body["stream_id"],
        body["stream_epoch"],
        body["start_offset"],
        body["end_offset"],
        body["object_size"],
        body["source_object_ids"],
    )
    return {}


async def expire_prepared_objects(ctx: BrokerContext, body: Body, version: int) -> Body:
    return {"object_ids": await ctx.replicas.storage.metadata.expire_prepared()}


async def destroy_s3_objects(ctx: BrokerContext, body: Body, version: int) -> Body:
    await ctx.replicas.storage.metadata.mark_destroyed_done(body["object_ids"])
    return {}


# -- reads ------------------------------------------------------------------------------------


async def get_kvs(ctx: BrokerContext, body: Body, version: int) -> Body:
    metadata = ctx.replicas.storage.metadata
    answers = []
    for r in body["get_key_requests"]:
        key = f"{r['namespace']}/{r['key']}" if r["namespace"] else r["key"]
        answers.append({"error_code": ErrorCode.NONE, "value": metadata.get_kv(key)})
    return {"get_kv_responses": answers}


def _stream_owners(ctx: BrokerContext) -> dict[int, tuple[TopicInfo, int]]:
    """Stream id -> (topic, partition) for every stream this broker can place: each partition's
    MetaStream (from the KV) and the data streams of the partitions it has opened."""
    metadata = ctx.replicas.storage.metadata
    namespace = ctx.replicas.storage.config.namespace
    owners: dict[int, tuple[TopicInfo, int]] = {}
    for topic in ctx.topics.all():
        for index in range(topic.partitions):
            raw = metadata.get_kv(meta_stream_key(namespace, str(topic.topic_id), index))
            if raw is not None and len(raw) == STREAM_ID.size:
                owners[STREAM_ID.unpack(raw)[0]] = (topic, index)
        for partition in ctx.open_partitions(topic.name):
            for stream_id in partition.log.stream_map.values():
                if stream_id >= 0:
                    owners[stream_id] = (topic, partition.index)
    return owners


async def describe_streams(ctx: BrokerContext, body: Body, version: int) -> Body:
    wanted = {
        (t["topic_name"], p["partition_index"])
        for t in body["topic_partitions"]
        for p in t["partitions"]
    }
    owners = _stream_owners(ctx)
    out = []
    for stream_id, s in sorted(ctx.replicas.storage.metadata.image.streams.items()):
        owner = s.owner if s.owner is not None else NO_NODE
        topic, index = owners.get(stream_id, (None, NO_PARTITION))
        if body["stream_id"] != -1 and stream_id != body["stream_id"]:
            continue
        if body["node_id"] != NO_NODE and owner != body["node_id"]:
            continue
        if wanted and (topic is None or (topic.name, index) not in wanted):
            continue
        out.append(
            {
                "stream_id": stream_id,
                "node_id": owner,
                "state": s.state.name,
                "topic_id": topic.topic_id if topic is not None else ZERO_UUID,
                "topic_name": topic.name if topic is not None else "",
                "partition_index": index,
                "epoch": s.epoch,
                "start_offset": s.start_offset,
                "end_offset": s.end_offset,
            }
        )
    return {"stream_metadata_list": out}


async def describe_s3_metadata(ctx: BrokerContext, body: Body, version: int) -> Body:
    image = ctx.replicas.storage.metadata.image
    streams = [
        {
            "stream_id": s.stream_id,
            "epoch": s.epoch,
            "state": int(s.state),
            "start_offset": s.start_offset,
            "end_offset": s.end_offset,
            "ranges": [
                {
                    "range_index": r.range_index,
                    "epoch": r.epoch,
                    "start_offset": r.start_offset,
                    "end_offset": r.end_offset,
                    "node_id": r.node_id,
                }
                for r in s.ranges
            ],
            "stream_objects": [
                {
                    "object_id": so.object_id,
                    "start_offset": so.start_offset,
                    "end_offset": so.end_offset,
                    "object_size": so.object_size,
                }
                for so in s.stream_objects
            ],
        }
        for _, s in sorted(image.streams.items())
    ]
    nodes = [
        {
            "node_id": n.node_id,
            "node_epoch": n.epoch,
            "failover": n.failover,
            "stream_set_objects": [
                {
                    "object_id": sso.object_id,
                    "order_id": sso.order_id,
                    "data_time_ms": sso.data_time_ms,
                    "object_size": sso.object_size,
                    "ranges": [
                        {
                            "stream_id": r.stream_id,
                            "start_offset": r.start_offset,
                            "end_offset": r.end_offset,
                        }
                        for r in sso.ranges
                    ],
                }
                for sso in n.stream_set_objects
            ],
        }
        for _, n in sorted(image.nodes.items())
    ]
    objects = [
        {
            "object_id": o.object_id,
            "state": int(o.state),
            "object_size": o.object_size,
            "prepared_ms": o.prepared_ms,
            "expires_ms": o.expires_ms,
            "committed_ms": NO_TIME if o.committed_ms is None else o.committed_ms,
            "mark_destroyed_ms": NO_TIME if o.mark_destroyed_ms is None else o.mark_destroyed_ms,
        }
        for _, o in sorted(image.objects.items())
    ]
    return {
        "now_ms": _now_ms(),
        "next_object_id": image.next_id(OBJECT_ID_COUNTER),
        "streams": streams,
        "nodes": nodes,
        "objects": objects,
    }


async def describe_log_segments(ctx: BrokerContext, body: Body, version: int) -> Body:
    """Every partition of the named topics (all topics when none are named; unknown names are
    left out), opened if it was not, with its segments and the topic's effective configs.
    With a ``cleanup_policy`` (v1), topics whose policy lacks it are left out before any of
    their partitions is opened (the maintenance's key-compaction check asks every
    ``log.cleaner.backoff.ms`` for ``compact`` topics only: idle other partitions stay shut)."""
    names: list[str] = body["topics"]
    wanted: str = body["cleanup_policy"]
    found = [ctx.topics.get(n) for n in dict.fromkeys(names)] if names else ctx.topics.all()
    topics = []
    for topic in found:
        if topic is None:
            continue
        config = ctx.replicas.log_config(topic)
        if wanted and wanted not in config.cleanup_policy:
            continue
        partitions: list[Body] = []
        for index in range(topic.partitions):
            if ctx.replicas.leader_epoch(topic.name, index) is None:
                # another broker of the cluster leads it: its maintenance tends it
                partitions.append(
                    {"partition_index": index, "error_code": ErrorCode.NOT_LEADER_OR_FOLLOWER}
                )
                continue
            try:
                partition = await ctx.replicas.partition(topic, index)
            except Exception:
                log.exception("DescribeLogSegments: cannot open %s-%d", topic.name, index)
                partitions.append(
                    {"partition_index": index, "error_code": ErrorCode.KAFKA_STORAGE_ERROR}
                )
                continue
            elastic_log = partition.log
            partitions.append(
                {
                    "partition_index": index,
                    "error_code": ErrorCode.NONE,
                    "log_start_offset": elastic_log.log_start_offset,
                    "log_end_offset": elastic_log.log_end_offset,
                    "last_stable_offset": elastic_log.last_stable_offset,
                    "segments": [
                        {
                            "base_offset": s.base_offset,
                            "next_offset": s.next_offset,
                            "size_bytes": s.size,
                            "max_timestamp": s.max_timestamp,
                            "cleaned": s.cleaned,
                            "first_batch_timestamp": s.first_batch_timestamp,
                        }
                        for s in elastic_log.segment_infos()
                    ],
                }
            )
        topics.append(
            {
                "name": topic.name,
                "topic_id": topic.topic_id,
                "cleanup_policy": ",".join(config.cleanup_policy),
                "retention_ms": config.retention_ms,
                "retention_bytes": config.retention_bytes,
                "delete_retention_ms": config.delete_retention_ms,
                "min_cleanable_dirty_ratio": repr(config.min_cleanable_dirty_ratio),
                "min_compaction_lag_ms": config.min_compaction_lag_ms,
                "max_compaction_lag_ms": config.max_compaction_lag_ms,
                "partitions": partitions,
            }
        )
    return {"now_ms": _now_ms(), "topics": topics}


async def commit_cleaned_segment(ctx: BrokerContext, body: Body, version: int) -> Body:
    """Key compaction's output for one partition replaces its sealed segments of
    ``[base_offset, end_offset)``."""
    topic = ctx.topics.get(body["topic"])
    index = body["partition_index"]
    if topic is None or not 0 <= index < topic.partitions:
        return {"error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    partition = await ctx.replicas.partition(topic, index)
    batches = [CleanedBatch(b["data"], b["count"]) for b in body["batches"]]
    aborted = [
        AbortedTxn(a["producer_id"], a["first_offset"], a["last_offset"], a["last_stable_offset"])
        for a in body["aborted_transactions"]
    ]
    try:
        replaced = await partition.log.replace_with_cleaned(
            body["base_offset"], body["end_offset"], batches, aborted
        )
    except CleanedSegmentError as e:
        log.info("CommitCleanedSegment for %s-%d refused: %s", topic.name, index, e)
        return {"error_code": ErrorCode.INVALID_REQUEST, "error_message": str(e)}
    return {"segments_replaced": replaced}


_ANSWERS: dict[int, Answer] = {
    ApiKey.PREPARE_S3_OBJECT: prepare_s3_object,
    ApiKey.COMMIT_STREAM_SET_OBJECT: commit_stream_set_object,
    ApiKey.COMMIT_STREAM_OBJECT: commit_stream_object,
    ApiKey.GET_KVS: get_kvs,
    ApiKey.DESCRIBE_STREAMS: describe_streams,
    ApiKey.DESCRIBE_S3_METADATA: describe_s3_metadata,
    ApiKey.EXPIRE_PREPARED_OBJECTS: expire_prepared_objects,
    ApiKey.DESTROY_S3_OBJECTS: destroy_s3_objects,
    ApiKey.DESCRIBE_LOG_SEGMENTS: describe_log_segments,
    ApiKey.COMMIT_CLEANED_SEGMENT: commit_cleaned_segment,
}

HANDLERS: dict[int, tuple[Any, int, int]] = {
    key: (_handler(key, answer), ext.MESSAGES[key].min_version, ext.MESSAGES[key].max_version)
    for key, answer in _ANSWERS.items()
}
