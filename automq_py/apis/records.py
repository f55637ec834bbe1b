"""DeleteRecords (21): move partitions' log start offsets forward.

``offset`` -1 means the high watermark (delete everything). The log start moves at once and
durably (ElasticLog.truncate_start); whole segments below it are dropped and their streams
trimmed. The answer's ``low_watermark`` is the log start offset afterwards. As in Kafka, each
topic needs DELETE on it (else TOPIC_AUTHORIZATION_FAILED, whether it exists or not), an
internal topic's records are not deleted (INVALID_TOPIC_EXCEPTION), and a partition another
broker leads is answered NOT_LEADER_OR_FOLLOWER, the request's others going on.
"""

from __future__ import annotations

from typing import Any

from automq_py.apis.context import BrokerContext
from automq_py.errors import partition_failed
from automq_py.log.elastic_log import LogOffsetOutOfRangeError
from automq_py.partition import Partition
from automq_py.security.acls import AclOperation, ResourceType
from protocol import build
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request, response_schema

HIGH_WATERMARK = -1


async def handle_delete_records(ctx: BrokerContext, request: Request) -> Any:
    topics = []
    for t in request.body.topics:
        name = str(t.name)
        info = ctx.topics.get(name)
        allowed = ctx.allowed(AclOperation.DELETE, ResourceType.TOPIC, name)
        parts = []
        for p in t.partitions:
            index = int(p.partition_index)
            entry: dict[str, Any] = {
                "partition_index": index,
                "low_watermark": -1,
                "error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            }
            if not allowed:
                entry["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif info is not None and info.internal and 0 <= index < info.partitions:
                entry["error_code"] = ErrorCode.INVALID_TOPIC_EXCEPTION
            elif info is not None and 0 <= index < info.partitions:
                try:
                    partition = await ctx.replicas.partition(info, index)
                    error = await delete_records_before(partition, int(p.offset))
                except Exception as e:  # led elsewhere, or its log failed: this partition's
                    error = partition_failed("delete records of", name, index, e)
                    partition = None
                entry["error_code"] = error
                if error == ErrorCode.NONE and partition is not None:
                    entry["low_watermark"] = partition.log_start_offset
            parts.append(entry)
        topics.append({"name": name, "partitions": parts})
    return build.build(
        response_schema(ApiKey.DELETE_RECORDS, request.api_version),
        {"throttle_time": 0, "topics": topics},
    )


async def delete_records_before(partition: Partition, offset: int) -> ErrorCode:
    """Make ``offset`` (HIGH_WATERMARK: the high watermark) the log start, if it is later;
    Kafka's Partition.deleteRecordsOnLeader."""
    if "delete" not in partition.log.config.cleanup_policy:
        # a compacted-only log keeps its history by policy
        return ErrorCode.POLICY_VIOLATION
    target = partition.high_watermark if offset == HIGH_WATERMARK else offset
    if target < 0 or target > partition.high_watermark:
        return ErrorCode.OFFSET_OUT_OF_RANGE
    try:
        await partition.log.truncate_start(target)
    except LogOffsetOutOfRangeError:
        return ErrorCode.OFFSET_OUT_OF_RANGE
    return ErrorCode.NONE


HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.DELETE_RECORDS: (handle_delete_records, 0, 2),
}
