"""Fetch (1), ListOffsets (2) and OffsetForLeaderEpoch (23).

Fetch hands the partitions asked for to the ReplicaManager, which reads them and, while fewer
than ``min_bytes`` came back, waits on them for new data (or ``max_wait``): Kafka's delayed
fetch. Record batches are handed to the transport as the buffers the log returned, not
re-encoded.

Authorization is Kafka's (``KafkaApis.handleFetchRequest``, ``handleListOffsetRequest``): a
consumer's fetch needs READ on each topic and a follower's (``replica_id`` >= 0) CLUSTER_ACTION
on the cluster, a refused partition answering TOPIC_AUTHORIZATION_FAILED (and left out of the
read, so the others still wait for data); ListOffsets needs DESCRIBE on each topic, and
OffsetForLeaderEpoch CLUSTER_ACTION on the cluster or DESCRIBE on each topic.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from automq_py.apis.context import BrokerContext
from automq_py.errors import partition_failed
from automq_py.fetch_reader import FetchData, FetchEntry, fetch_data, leader_epoch_error
from automq_py.log.elastic_log import LogOffsetOutOfRangeError
from automq_py.partition import Partition
from automq_py.security.acls import AclOperation, ResourceType
from automq_py.security.quotas import FETCH as FETCH_QUOTA
from automq_py.security.session import SESSION, THROTTLE_MS
from protocol import build, record_batch, wire
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.fetch import (
    FetchPartitionResult,
    FetchTopicResult,
    NodeEndpoint,
    encode_fetch_response,
)
from protocol.messages import Request, response_schema
from protocol.record_batch import InvalidRecordBatchError
from protocol.records import parse_records

# ListOffsets' special timestamps
LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3  # v7+ (KIP-734)
EARLIEST_LOCAL = -4  # v8+ (KIP-405): the first offset held locally, not in remote storage
LATEST_TIERED = -5  # v9+ (KIP-1005): the last offset in remote storage
# the first ListOffsets version of each special timestamp (Kafka's
# timestampMinSupportedVersion); any other negative timestamp is UNSUPPORTED_VERSION
SPECIAL_TIMESTAMP_VERSIONS = {
    EARLIEST: 1,
    LATEST: 1,
    MAX_TIMESTAMP: 7,
    EARLIEST_LOCAL: 8,
    LATEST_TIERED: 9,
}
NEVER = 1 << 15  # a version no request has
READ_COMMITTED = 1  # isolation_level of Fetch v4+ and ListOffsets v2+
# Fetch versions whose clients do not know KAFKA_STORAGE_ERROR (KIP-112 gave it to v6)
LAST_WITHOUT_STORAGE_ERROR = 5
# the first Fetch version whose consumers read zstd (KIP-110)
FIRST_ZSTD_VERSION = 10

READ, CLUSTER_ACTION, TOPIC = AclOperation.READ, AclOperation.CLUSTER_ACTION, ResourceType.TOPIC
# the errors a partition's answer names its current leader with (v16+, KIP-951)
LEADER_HINTED = (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH)


async def handle_fetch(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    wait_ms = getattr(body, "max_wait_ms", None)  # (protocol.fetch's; kio's is a timedelta)
    max_wait = wait_ms / 1000 if wait_ms is not None else body.max_wait.total_seconds()
    # as Kafka: the request's max_bytes (v3+; 0 returns one batch) within the broker's
    # fetch.max.bytes, and min_bytes within that
    max_bytes = min(int(getattr(body, "max_bytes", 0x7FFFFFFF)), ctx.config.fetch_max_bytes)
    secured = ctx.secured
    # a follower's fetch needs CLUSTER_ACTION (None: a consumer's, which needs READ per topic)
    follower_allowed = (
        ctx.allowed_on_cluster(CLUSTER_ACTION) if secured and _from_follower(body) else None
    )
    names: list[str] = []
    entries: list[FetchEntry] = []
    for t in body.topics:
        topic_id = getattr(t, "topic_id", None)
        name = getattr(t, "topic", None)
        info = (
            ctx.topics.by_id(topic_id) if name is None and topic_id else ctx.topics.get(str(name))
        )
        names.append(str(name or (info.name if info else "")))
        # an id that names no topic is UNKNOWN_TOPIC_ID (v13+), a partition it lacks is not
        missing = (
            ErrorCode.UNKNOWN_TOPIC_ID
            if name is None and info is None
            else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        )
        if secured and _refused_topic(ctx, info, name, follower_allowed):
            info, missing = None, ErrorCode.TOPIC_AUTHORIZATION_FAILED
        for p in t.partitions:
            entries.append(
                FetchEntry(
                    info,
                    p.partition,
                    p.fetch_offset,
                    p.partition_max_bytes,
                    missing,
                    getattr(p, "current_leader_epoch", -1),
                )
            )
    # Kafka answers the partitions it does not know, and those refused, without reading them
    # (its "erroneous" ones): they neither wait nor cut short the others' wait for data, so a
    # consumer still assigned a deleted topic's partitions is not answered at once, again and
    # again, while it learns of the deletion
    read = entries
    erroneous = not all(e.known for e in entries)
    if erroneous:
        read = [e for e in entries if e.known]
    results: list[FetchData] = []
    if read:
        results = await ctx.replicas.fetch_messages(
            read,
            max_bytes=max_bytes,
            min_bytes=min(max(0, int(body.min_bytes)), max_bytes),
            max_wait_s=max_wait,
            read_committed=int(getattr(body, "isolation_level", 0)) == READ_COMMITTED,
        )
        if not ctx.replicas.session_holds():  # (checked once the fetch is ready to answer)
            results = [
                _unless_failed(e, r, ErrorCode.NOT_LEADER_OR_FOLLOWER)
                for e, r in zip(read, results, strict=True)
            ]
    if erroneous:
        done = iter(results)
        results = [next(done) if e.known else fetch_data(e, e.error) for e in entries]
    if request.api_version < FIRST_ZSTD_VERSION:
        _refuse_zstd(ctx, entries, results)
    if request.api_version <= LAST_WITHOUT_STORAGE_ERROR:
        down_convert_storage_errors(results)
    # the reader's results are the response's partitions, in the request's order
    topics: list[FetchTopicResult] = []
    i = 0
    for t, name in zip(body.topics, names, strict=True):
        n = len(t.partitions)
        info = entries[i + n - 1].topic if n else None
        topic_id = info.topic_id if info else getattr(t, "topic_id", None)
        topics.append(FetchTopicResult(name, results[i : i + n], topic_id))
        i += n
    # a consumer over its quota gets what it asked for and waits the throttle time before it
    # asks again (the bytes are the quota's debt; Kafka answers such a fetch empty, which with
    # a bucket of one window's bytes would refuse a larger fetch for ever)
    throttle = _throttle(ctx, request, results)
    endpoints = _leader_hints(ctx, entries, results) if request.api_version >= 16 else []
    return encode_fetch_response(
        request.api_version,
        request.correlation_id,
        topics,
        throttle_time_ms=throttle,
        session_id=0,
        node_endpoints=endpoints,
    )


def _leader_hints(
    ctx: BrokerContext, entries: list[FetchEntry], results: list[FetchData]
) -> list[NodeEndpoint]:
    """KIP-951, as Kafka's handleFetchRequest: a partition answered NOT_LEADER_OR_FOLLOWER or
    FENCED_LEADER_EPOCH names its current leader and epoch; the addresses of those leaders,
    which the response carries."""
    leaders: set[int] = set()
    for entry, result in zip(entries, results, strict=True):
        topic = entry.topic
        if result.error_code in LEADER_HINTED and topic is not None and entry.known:
            hint = ctx.leader_hint(topic.name, entry.index)
            if hint is not None:
                result.current_leader = hint
                leaders.add(hint[0])
    return ctx.node_endpoints(leaders) if leaders else []


def _unless_failed(entry: FetchEntry, result: FetchData, error: ErrorCode) -> FetchData:
    return result if result.error_code != ErrorCode.NONE else fetch_data(entry, error)


def _refuse_zstd(ctx: BrokerContext, entries: list[FetchEntry], results: list[FetchData]) -> None:
    """For Fetch v9 and older, a partition of a ``compression.type=zstd`` topic is answered
    UNSUPPORTED_COMPRESSION_TYPE, without records, as Kafka answers it: those consumers
    cannot read what its batches hold."""
    for i, e in enumerate(entries):
        topic = e.topic
        if (
            topic is not None
            and e.known
            and ctx.replicas.log_config(topic).compression_type == "zstd"
        ):
            results[i] = fetch_data(e, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE)


def down_convert_storage_errors(results: list[FetchData]) -> None:
    """For Fetch v5 and older, KAFKA_STORAGE_ERROR becomes NOT_LEADER_OR_FOLLOWER, as Kafka
    answers it: their clients retry that after a metadata refresh, where the storage error
    would be an unknown, fatal one to them."""
    for r in results:
        if r.error_code == ErrorCode.KAFKA_STORAGE_ERROR:
            r.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER


def _throttle(ctx: BrokerContext, request: Request, results: list[FetchData]) -> int:
    """Record the response's bytes against a consumer's fetch quota, if it has one: the time
    it is throttled for (0: within its quota)."""
    quotas = ctx.quotas
    if quotas is None or not quotas.any or _from_follower(request.body):
        return 0
    size = sum(r.records_size for r in results)
    user, client_id = SESSION.get().user, request.header.client_id or ""
    throttle = quotas.record(FETCH_QUOTA, user, client_id, size)
    if throttle:
        THROTTLE_MS.set(throttle)
    return throttle


def _from_follower(body: Any) -> bool:
    """Whether a Fetch comes from a follower replica (a broker id, not a consumer's -1)."""
    state = getattr(body, "replica_state", None)  # v15+ (KIP-903)
    replica_id = state.replica_id if state is not None else getattr(body, "replica_id", -1)
    return int(replica_id) >= 0


def _refused_topic(ctx: BrokerContext, info: Any, name: Any, follower_allowed: bool | None) -> bool:
    """Whether a fetched topic is answered TOPIC_AUTHORIZATION_FAILED: every one of a follower
    without CLUSTER_ACTION, and those a consumer may not READ. A consumer's unknown topic id
    stays UNKNOWN_TOPIC_ID (Kafka checks it first: it names no topic to authorize)."""
    if follower_allowed is not None:
        return not follower_allowed
    if name is None and info is None:
        return False
    return not ctx.allowed(READ, TOPIC, str(name or info.name))


async def handle_list_offsets(ctx: BrokerContext, request: Request) -> Any:
    read_committed = int(getattr(request.body, "isolation_level", 0)) == READ_COMMITTED
    # Kafka's fetchOffsetForTimestamp: only a consumer (replica id -1) is held to the high
    # watermark or the stable offset; a follower or a debugging request (-2) reads to the end
    from_consumer = int(getattr(request.body, "replica_id", -1)) == -1
    asked = Counter(
        (str(t.name), int(p.partition_index)) for t in request.body.topics for p in t.partitions
    )
    # the answer by topic (Kafka's is built from a map of partitions: a topic named twice is
    # answered once, and so is a partition asked twice)
    grouped: dict[str, list[dict[str, Any]]] = {}
    for t in request.body.topics:
        info = ctx.topics.get(str(t.name))
        allowed = ctx.allowed(AclOperation.DESCRIBE, TOPIC, str(t.name))
        parts = grouped.setdefault(str(t.name), [])
        for p in t.partitions:
            index = int(p.partition_index)
            entry: dict[str, Any] = {
                "partition_index": index,
                "timestamp": -1,
                "offset": -1,
                "leader_epoch": -1,
                "error_code": ErrorCode.NONE,
            }
            ts = int(p.timestamp)
            # in Kafka's order: the topic's authorization, a partition asked twice (answered
            # once), a special timestamp the request's version does not know, the partition
            if not allowed:
                entry["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                parts.append(entry)
                continue
            if asked[str(t.name), index] > 1:
                entry["error_code"] = ErrorCode.INVALID_REQUEST
                if all(e["partition_index"] != index for e in parts):
                    parts.append(entry)
                continue
            if ts < 0 and request.api_version < SPECIAL_TIMESTAMP_VERSIONS.get(ts, NEVER):
                entry["error_code"] = ErrorCode.UNSUPPORTED_VERSION
                parts.append(entry)
                continue
            if info is None or not 0 <= index < info.partitions:
                entry["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                parts.append(entry)
                continue
            try:
                partition = await ctx.replicas.partition(info, index)
                epoch_error = leader_epoch_error(
                    int(getattr(p, "current_leader_epoch", -1)), partition.leader_epoch
                )
                if epoch_error is None and not ctx.replicas.session_holds():
                    epoch_error = ErrorCode.NOT_LEADER_OR_FOLLOWER  # (as Fetch answers)
                if epoch_error is not None:
                    entry["error_code"] = epoch_error
                    parts.append(entry)
                    continue
                epochs = partition.log.leader_epoch_cache
                # what a consumer may read: read_committed ones start from, and see lag to,
                # the stable offset; a record found at or past it is not answered (Kafka's
                # fetchOffsetForTimestamp)
                if not from_consumer:
                    fetchable = partition.log_end_offset
                elif read_committed:
                    fetchable = partition.last_stable_offset
                else:
                    fetchable = partition.high_watermark
                # each answer's leader epoch as Kafka's fetchOffsetByTimestamp gives it: the
                # partition's for the latest, the first entry's for the earliest (when it
                # starts there), else the epoch of the record's batch
                if ts in (EARLIEST, EARLIEST_LOCAL):
                    # no tiered storage (Kafka's remote log): the whole log is local
                    start = partition.log_start_offset
                    first = epochs.entries[0] if epochs.entries else None
                    entry.update(
                        offset=start,
                        leader_epoch=first[0] if first is not None and first[1] <= start else -1,
                    )
                elif ts == LATEST_TIERED:
                    pass  # nothing in remote storage: Kafka answers offset -1, epoch -1
                elif ts == LATEST:
                    entry.update(offset=fetchable, leader_epoch=partition.leader_epoch)
                elif ts == MAX_TIMESTAMP:
                    offset, max_ts = await partition.log.max_timestamp_offset()
                    if 0 <= offset < fetchable:
                        entry.update(
                            offset=offset,
                            timestamp=max_ts,
                            leader_epoch=epochs.epoch_for_offset(offset),
                        )
                else:
                    found = await first_record_at_or_after(partition, ts)
                    if found is not None and found[0] < fetchable:
                        entry.update(
                            offset=found[0],
                            timestamp=found[1],
                            leader_epoch=epochs.epoch_for_offset(found[0]),
                        )
            except Exception as e:
                entry["error_code"] = partition_failed("list offsets of", info.name, index, e)
                parts.append(entry)
                continue
            parts.append(entry)
    out = [{"name": name, "partitions": parts} for name, parts in grouped.items()]
    return build.build(
        response_schema(ApiKey.LIST_OFFSETS, request.api_version),
        {"throttle_time": 0, "topics": out},
    )


async def handle_offset_for_leader_epoch(ctx: BrokerContext, request: Request) -> Any:
    """Where each asked leader epoch ends in a partition's log (KIP-101, KIP-320: a consumer
    checks its position after a leader change), as Kafka's ``lastOffsetForLeaderEpoch``:
    the largest epoch at or below the one asked and the start of the next (the log end for
    the latest); -1, -1 for an epoch past the latest. CLUSTER_ACTION on the cluster or
    DESCRIBE on each topic."""
    cluster_allowed = ctx.allowed_on_cluster(CLUSTER_ACTION)
    out = []
    for t in request.body.topics:
        name = str(t.topic)
        allowed = cluster_allowed or ctx.allowed(AclOperation.DESCRIBE, TOPIC, name)
        info = ctx.topics.get(name) if allowed else None
        parts = []
        for p in t.partitions:
            index = int(p.partition)
            entry: dict[str, Any] = {
                "error_code": ErrorCode.NONE,
                "partition": index,
                "leader_epoch": -1,
                "end_offset": -1,
            }
            parts.append(entry)
            if not allowed:
                entry["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            if info is None or not 0 <= index < info.partitions:
                entry["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            try:
                partition = await ctx.replicas.partition(info, index)
            except Exception as e:
                entry["error_code"] = partition_failed("end offset of an epoch of", name, index, e)
                continue
            error = leader_epoch_error(int(p.current_leader_epoch), partition.leader_epoch)
            if error is None and not ctx.replicas.session_holds():
                error = ErrorCode.NOT_LEADER_OR_FOLLOWER  # (as Fetch answers)
            if error is not None:
                entry["error_code"] = error
                continue
            log = partition.log
            epoch, end = log.leader_epoch_cache.end_offset_for(
                int(p.leader_epoch), log.log_end_offset
            )
            if end >= 0:
                entry.update(leader_epoch=epoch, end_offset=end)
        out.append({"topic": name, "partitions": parts})
    return build.build(
        response_schema(ApiKey.OFFSET_FOR_LEADER_EPOCH, request.api_version),
        {"throttle_time": 0, "topics": out},
    )


async def first_record_at_or_after(partition: Partition, timestamp: int) -> tuple[int, int] | None:
    """``(offset, timestamp)`` of the first record (from the log start) whose timestamp is >=
    ``timestamp``; None when there is none.

    The log's time index finds the first batch whose max timestamp reaches ``timestamp``; its
    records say which one does. Records below the log start do not count, so when only those
    reach it the search goes on to the next batches that can hold one.
    """
    found = await partition.log.offset_for_timestamp(timestamp)
    if found is None:
        return None
    offset = found[0]
    while offset < partition.high_watermark:
        start = max(offset, partition.log_start_offset)
        try:
            views = await partition.read(start, 1)  # the one batch holding ``start``
        except LogOffsetOutOfRangeError:
            return None
        next_offset = offset
        for view in views:
            for header, batch in record_batch.iter_batches(view):
                next_offset = header.last_offset + 1
                if header.max_timestamp < timestamp:
                    continue
                try:
                    records = parse_records(batch)
                except InvalidRecordBatchError:
                    return found  # unreadable records: the batch's answer is the best there is
                for record in records:
                    if record.offset >= start and record.timestamp >= timestamp:
                        return record.offset, record.timestamp
        if next_offset <= start:
            return None  # nothing read: the end of the log
        offset = next_offset
    return None


def error_response(request: Request, code: ErrorCode) -> list[wire.Buffer]:
    """A Fetch response giving ``code`` for every partition asked for (and at the top)."""
    topics = [
        FetchTopicResult(
            name=str(getattr(t, "topic", None) or ""),
            partitions=[FetchPartitionResult(int(p.partition), code) for p in t.partitions],
            topic_id=getattr(t, "topic_id", None),
        )
        for t in request.body.topics
    ]
    return encode_fetch_response(
        request.api_version, request.correlation_id, topics, error_code=code
    )


API_KEY = ApiKey.FETCH
# Kafka 3.9's maxima. Fetch >= 4, not Kafka 3.9's 0: v0-v3 answer with magic v0/v1 message
# sets, which this broker does not store (Kafka 4.0 dropped them too, KIP-896). ListOffsets v0
# (several offsets per partition), which Kafka 3.9 serves, is not in kio's schemas (Kafka 4.0
# removed it, KIP-896).
HANDLERS: dict[int, tuple[Any, int, int]] = {
    API_KEY: (handle_fetch, 4, 17),
    ApiKey.LIST_OFFSETS: (handle_list_offsets, 1, 9),
    # v0 and v1 went in Kafka 4.0 (KIP-896), and kio with them; librdkafka and the Java
    # client send v2+
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (handle_offset_for_leader_epoch, 2, 4),
}
