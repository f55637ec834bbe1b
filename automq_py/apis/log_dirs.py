"""DescribeLogDirs (35): the broker's log directory and the partition logs in it.

As in Kafka 3.9 (``KafkaApis.handleDescribeLogDirsRequest``, ``ReplicaManager.describeLogDirs``):
null topics describe every partition log; otherwise only the partitions named that have a log
here are described (an unknown one is left out, not answered with an error), and a topic none
of whose partitions is described is left out too (KAFKA-16807, Kafka 3.8). The one directory is
the WAL's (``s3.wal.path``), its absolute path as the name; v4's total and usable bytes are its
volume's. Every partition is led here, so no log end offset is behind the high watermark
(offset lag 0) and no log is a future log.

Without DESCRIBE on the cluster the answer describes no directory: CLUSTER_AUTHORIZATION_FAILED
at the top from v3 (the first version with that field), an empty list before, as Kafka answers.

v0-v4, Kafka 3.9's versions. v0 is v1's message (KIP-219 only changed when a throttled answer
is sent); kio has no schema for it (Kafka 4 dropped it, KIP-896), so it is read and written
with v1's (``protocol.schemas``).
"""

from __future__ import annotations

from typing import Any

from automq_py.apis.context import BrokerContext
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
    partitions this broker has no log for are dropped."""
    if topics is None:
        return [(t, i) for t in ctx.topics.all() for i in range(t.partitions)]
    wanted: dict[str, set[int]] = {}
    for t in topics:
        wanted.setdefault(str(t.topic), set()).update(int(p) for p in t.partitions)
    out = []
    for name in sorted(wanted):
        info = ctx.topics.get(name)
        if info is not None:
            out += [(info, i) for i in sorted(wanted[name]) if 0 <= i < info.partitions]
    return out


HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.DESCRIBE_LOG_DIRS: (handle_describe_log_dirs, 0, 4),
}
