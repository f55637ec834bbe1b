"""DescribeLogDirs (35): the broker's log directory and the partition logs in it;
AlterReplicaLogDirs (34): moving a partition log to another of the broker's log directories.

As in Kafka 3.9 (``KafkaApis.handleDescribeLogDirsRequest``, ``ReplicaManager.describeLogDirs``):
null topics describe every partition log; otherwise only the partitions named that have a log
here are described (an unknown one is left out, not answered with an error), and a topic none
of whose partitions is described is left out too (KAFKA-16807, Kafka 3.8). The one directory is
the WAL's (``s3.wal.path``), its absolute path as the name; v4's total and usable bytes are its
volume's. A broker of a cluster describes the partitions it leads, the only logs it holds (a
partition has one replica); no log end offset is behind the high watermark (offset lag 0) and no
log is a future log.

Without DESCRIBE on the cluster the answer describes no directory: CLUSTER_AUTHORIZATION_FAILED
at the top from v3 (the first version with that field), an empty list before, as Kafka answers.

v0-v4, Kafka 3.9's versions. v0 is v1's message (KIP-219 only changed when a throttled answer
is sent); kio has no schema for it (Kafka 4 dropped it, KIP-896), so it is read and written
with v1's (``protocol.schemas``).

AlterReplicaLogDirs has one directory to move to, the one every log is in: as in Kafka 3.9
(``ReplicaManager.alterReplicaLogDirs``), a partition sent to its current directory is answered
NONE and nothing moves. Each partition is checked in Kafka's order: a topic name too long for
a future log's directory name (KAFKA-4893) is INVALID_TOPIC_EXCEPTION; a path that is not the
log directory's as DescribeLogDirs names it (the same string: Kafka compares absolute paths as
given) is LOG_DIR_NOT_FOUND, even for an unknown partition; an offline directory is
KAFKA_STORAGE_ERROR; an unknown topic or partition is UNKNOWN_TOPIC_OR_PARTITION, and one led by
another broker REPLICA_NOT_AVAILABLE (Kafka's NOT_LEADER_OR_FOLLOWER, kept as that for this API).
A partition named in several directories is answered once, for the last. Without ALTER on the
cluster every partition named is CLUSTER_AUTHORIZATION_FAILED. v0-v2 (Kafka 3.9's); v0 is v1's
message, read and written with kio's v1 classes as DescribeLogDirs v0 is.
"""

from __future__ import annotations

from typing import Any

from automq_py.apis.context import BrokerContext, respond
from automq_py.replica_manager import LogDirInfo
from automq_py.security.acls import AclOperation
from automq_py.topics import TopicInfo
from protocol import build
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request, response_schema


async def handle_describe_log_dirs(ctx: BrokerContext, request: Request) -> Any:
    if not ctx.allowed_on_cluster(AclOperation.DESCRIBE):
        return build.build(
            response_schema(ApiKey.DESCRIBE_LOG_DIRS, request.api_version),
            {
                "throttle_time": 0,
                "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "results": [],
            },
        )
    wanted = logs_asked_for(ctx, request.body.topics)
    info = await ctx.replicas.describe_log_dir(wanted)
    topics: dict[str, list[dict[str, Any]]] = {}
    for r in info.replicas:
        topics.setdefault(r.topic, []).append(
            {
                "partition_index": r.index,
                "partition_size": r.size,
                "offset_lag": r.offset_lag,
                "is_future_key": False,
            }
        )
    result = {
        "error_code": info.error,
        "log_dir": info.path,
        "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()],
        "total_bytes": info.total_bytes,
        "usable_bytes": info.usable_bytes,
    }
    return build.build(
        response_schema(ApiKey.DESCRIBE_LOG_DIRS, request.api_version),
        {"throttle_time": 0, "error_code": ErrorCode.NONE, "results": [result]},
    )


def logs_asked_for(ctx: BrokerContext, topics: Any) -> list[tuple[TopicInfo, int]]:
    """The partition logs a request's ``topics`` name (null: all), each once, in topic order;
    partitions this broker has no log for (unknown, or led by another broker) are dropped."""
    if topics is None:
        asked = [(t, i) for t in ctx.topics.all() for i in range(t.partitions)]
    else:
        wanted: dict[str, set[int]] = {}
        for t in topics:
            wanted.setdefault(str(t.topic), set()).update(int(p) for p in t.partitions)
        asked = []
        for name in sorted(wanted):
            info = ctx.topics.get(name)
            if info is not None:
                asked += [(info, i) for i in sorted(wanted[name]) if 0 <= i < info.partitions]
    if ctx.cluster is None:
        return asked
    return [(t, i) for t, i in asked if ctx.leadership(t.name, i).leader == ctx.node_id]


async def handle_alter_replica_log_dirs(ctx: BrokerContext, request: Request) -> Any:
    dirs = request.body.dirs
    if not ctx.allowed_on_cluster(AclOperation.ALTER):
        refused = [
            {
                "topic_name": t.name,
                "partitions": [
                    {"partition_index": p, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED}
                    for p in t.partitions
                ],
            }
            for d in dirs
            for t in d.topics
        ]
        return respond(request, {"throttle_time": 0, "results": refused})
    destinations: dict[tuple[str, int], str] = {}  # the last directory named wins, as in Kafka
    for d in dirs:
        for t in d.topics:
            for p in t.partitions:
                destinations[(str(t.name), int(p))] = str(d.path)
    log_dir = await ctx.replicas.describe_log_dir([])  # its path and whether it is online
    results: dict[str, list[dict[str, Any]]] = {}
    for (topic, index), path in destinations.items():
        error = alter_error(ctx, log_dir, topic, index, path)
        results.setdefault(topic, []).append({"partition_index": index, "error_code": error})
    topics = [{"topic_name": name, "partitions": parts} for name, parts in results.items()]
    return respond(request, {"throttle_time": 0, "results": topics})


# a future log's directory: "<topic>-<partition>.<32 hex digits>-future", at most 255 chars
_FUTURE_DIR_EXTRA = len(".") + 32 + len("-future")


def alter_error(ctx: BrokerContext, log_dir: LogDirInfo, topic: str, index: int, path: str) -> int:
    """The answer to moving partition ``index`` of ``topic`` to directory ``path``."""
    if len(f"{topic}-{index}") + _FUTURE_DIR_EXTRA > 255:
        return ErrorCode.INVALID_TOPIC_EXCEPTION
    if path != log_dir.path:
        return ErrorCode.LOG_DIR_NOT_FOUND
    if log_dir.error != ErrorCode.NONE:
        return ErrorCode.KAFKA_STORAGE_ERROR
    info = ctx.topics.get(topic)
    if info is None or not 0 <= index < info.partitions:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if ctx.leadership(topic, index).leader != ctx.node_id:
        return ErrorCode.REPLICA_NOT_AVAILABLE
    return ErrorCode.NONE  # already there


HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.DESCRIBE_LOG_DIRS: (handle_describe_log_dirs, 0, 4),
    ApiKey.ALTER_REPLICA_LOG_DIRS: (handle_alter_replica_log_dirs, 0, 2),
}
