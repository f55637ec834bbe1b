"""Produce (0): validate, assign offsets and append each partition's batches.

Every acknowledgement (acks=1 and acks=all alike) is sent after the data is fsynced in the WAL,
which is what acks=all promises; acks=0 gets no response at all.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from automq_py.apis.context import BrokerContext
from automq_py.errors import describe, kafka_error
from automq_py.partition import AppendResult, Partition
from protocol import build
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request, response_schema
from protocol.produce import ProducePartitionData

log = logging.getLogger("automq.produce")


async def handle_produce(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    acks = body.acks
    jobs: list[tuple[str, int, asyncio.Future[AppendResult] | AppendResult]] = []
    for t in body.topics:
        name = t.name
        for p in t.partitions:
            jobs.append((str(name), p.index, await _start(ctx, name, p, acks)))
    results = [
        (name, index, job if isinstance(job, AppendResult) else await job)
        for name, index, job in jobs
    ]
    if any(r.error == ErrorCode.NONE for _, _, r in results):
        ctx.replicas.notify_data()
    if acks == 0:
        return None
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for name, index, r in results:
        by_topic.setdefault(name, []).append(
            {
                "index": index,
                "error_code": r.error,
                "base_offset": r.base_offset,
                "log_append_time": -1,
                "log_start_offset": r.log_start_offset,
                "error_message": r.message,
            }
        )
    return build.build(
        response_schema(0, request.api_version),
        {
            "throttle_time": 0,
            "responses": [
                {"name": name, "partition_responses": parts} for name, parts in by_topic.items()
            ],
        },
    )


async def _start(
    ctx: BrokerContext, name: str | None, p: ProducePartitionData, acks: int
) -> asyncio.Future[AppendResult] | AppendResult:
    """Begin the append of one partition (partitions append concurrently)."""
    if acks not in (-1, 0, 1):
        return AppendResult(ErrorCode.INVALID_REQUIRED_ACKS, message=f"acks={acks}")
    topic = None
    error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if name is not None:
        # as in Kafka, only Metadata auto-creates topics; Produce to an unknown one is an error
        topic, error = await ctx.topic_for_write(name, auto_create=False)
    if topic is None:
        return AppendResult(error)
    if not 0 <= p.index < topic.partitions:
        return AppendResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    if topic.internal:
        # only the coordinators write there (Kafka's internalTopicsAllowed is false for clients)
        return AppendResult(
            ErrorCode.INVALID_TOPIC_EXCEPTION, message=f"cannot append to internal topic {name}"
        )
    if p.records is None:
        return AppendResult(ErrorCode.CORRUPT_MESSAGE, message="null records")
    try:
        partition = await ctx.replicas.partition(topic, p.index)
    except Exception as e:
        return _failed(topic.name, p.index, e)
    return asyncio.ensure_future(_append(partition, p.records))


async def _append(partition: Partition, records: memoryview) -> AppendResult:
    """The partition's append; a storage failure is this partition's error, as in Kafka's
    ReplicaManager, and the other partitions and the connection carry on."""
    try:
        return await partition.append_records(records)
    except Exception as e:
        return _failed(partition.topic, partition.index, e)


def _failed(topic: str, index: int, error: Exception) -> AppendResult:
    code = kafka_error(error)
    log.warning("produce to %s-%d failed: %s (%s)", topic, index, describe(error), code.name)
    return AppendResult(code, message=describe(error))


API_KEY = ApiKey.PRODUCE
# Produce >= 3: magic v2 only (Kafka 4 clients need it). v13 names topics by id: not handled.
HANDLERS: dict[int, tuple[Any, int, int]] = {API_KEY: (handle_produce, 3, 12)}
