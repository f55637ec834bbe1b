"""The transaction APIs: AddPartitionsToTxn (24), AddOffsetsToTxn (25), EndTxn (26),
WriteTxnMarkers (27), TxnOffsetCommit (28), DescribeProducers (61), DescribeTransactions (65),
ListTransactions (66).

WriteTxnMarkers is what a coordinator sends partition leaders; this broker's own coordinator
writes its markers directly, so requests come from admin tools (``kafka-transactions.sh abort``
and its peers: an ABORT for a hanging transaction). DescribeProducers lists a partition's
producers and the first offset of each one's open transaction (how such tools find hanging
ones).

InitProducerId with a transactional id is in :mod:`automq_py.apis.producer`. The decisions are
the :class:`~automq_py.coordinator.transaction_coordinator.TransactionCoordinator`'s; these
handlers check what Kafka's ``KafkaApis`` checks first (the partitions exist, no internal topic
but ``__consumer_offsets`` through AddOffsetsToTxn) and give each version the error code it
knows (``PRODUCER_FENCED`` is ``INVALID_PRODUCER_EPOCH`` to older clients).

Authorization is Kafka's: a producer's requests need WRITE on its transactional id
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED), AddPartitionsToTxn WRITE on each topic (an internal
one is never granted), AddOffsetsToTxn and TxnOffsetCommit READ on the group
(GROUP_AUTHORIZATION_FAILED), TxnOffsetCommit READ on each topic; what brokers send each other
(AddPartitionsToTxn v4+, WriteTxnMarkers) needs CLUSTER_ACTION on the cluster. DescribeProducers
needs READ on the topic, DescribeTransactions DESCRIBE on each transactional id (and shows only
the topics the session may DESCRIBE); ListTransactions lists the ids the session may DESCRIBE.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

from automq_py.apis.context import BrokerContext, respond
from automq_py.coordinator import transaction_metadata as tm
from automq_py.coordinator.group_coordinator import OFFSETS_TOPIC
from automq_py.coordinator.offsets import OffsetCommit
from automq_py.coordinator.transaction_coordinator import TransactionCoordinator
from automq_py.errors import partition_failed
from automq_py.partition import AppendResult
from automq_py.security.acls import AclOperation, ResourceType
from automq_py.topics import INTERNAL_TOPICS
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request

TopicPartition = tuple[str, int]
NO_TIME = datetime.datetime.fromtimestamp(-0.001, tz=datetime.UTC)  # Kafka's -1 ms
EPOCH_TIME = datetime.datetime.fromtimestamp(0, tz=datetime.UTC)  # 0 ms

WRITE, READ, DESCRIBE = AclOperation.WRITE, AclOperation.READ, AclOperation.DESCRIBE
TOPIC, GROUP = ResourceType.TOPIC, ResourceType.GROUP
TXN_REFUSED = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def _may_write(ctx: BrokerContext, transactional_id: str) -> bool:
    return ctx.allowed(WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)


def _coordinator(ctx: BrokerContext) -> TransactionCoordinator:
    assert ctx.transactions is not None, "the broker starts its coordinators before serving"
    return ctx.transactions


def _for_version(request: Request, error: ErrorCode) -> ErrorCode:
    return tm.error_for_version(request.api_key, request.api_version, error)


def _by_topic(results: dict[TopicPartition, ErrorCode]) -> list[dict[str, Any]]:
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), error in results.items():
        topics.setdefault(topic, []).append(
            {"partition_index": partition, "partition_error_code": error}
        )
    return [{"name": name, "results_by_partition": parts} for name, parts in topics.items()]


async def _add_partitions(
    ctx: BrokerContext,
    request: Request,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    topics: Any,
    verify_only: bool = False,
) -> dict[TopicPartition, ErrorCode]:
    wanted = [(str(t.name), int(p)) for t in topics for p in t.partitions]
    if request.api_version < 4 and not _may_write(ctx, transactional_id):
        return dict.fromkeys(wanted, TXN_REFUSED)
    # Kafka's KafkaApis: partitions a client may not write (an internal topic never) or that
    # do not exist fail, the others are not attempted. A broker's verification (v4+) may ask
    # for an internal one: a group coordinator, for the offsets partition of a TxnOffsetCommit
    failed: dict[TopicPartition, ErrorCode] = {}
    for tp in wanted:
        info = ctx.topics.get(tp[0])
        if request.api_version < 4 and (
            tp[0] in INTERNAL_TOPICS or not ctx.allowed(WRITE, TOPIC, tp[0])
        ):
            failed[tp] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif info is None or not 0 <= tp[1] < info.partitions:
            failed[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if failed:
        return {tp: failed.get(tp, ErrorCode.OPERATION_NOT_ATTEMPTED) for tp in wanted}
    coordinator = _coordinator(ctx)
    if verify_only:
        return await coordinator.verify_partitions(
            transactional_id, producer_id, producer_epoch, wanted
        )
    error = await coordinator.add_partitions(transactional_id, producer_id, producer_epoch, wanted)
    return dict.fromkeys(wanted, _for_version(request, error))


async def handle_add_partitions_to_txn(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    if request.api_version < 4:
        results = await _add_partitions(
            ctx,
            request,
            str(body.v3_and_below_transactional_id),
            int(body.v3_and_below_producer_id),
            int(body.v3_and_below_producer_epoch),
            body.v3_and_below_topics,
        )
        return respond(
            request, {"throttle_time": 0, "results_by_topic_v3_and_below": _by_topic(results)}
        )
    # v4+ (KIP-890): a batch of transactions, sent by brokers; verify_only asks, not adds
    if not ctx.allowed_on_cluster(AclOperation.CLUSTER_ACTION):
        return respond(
            request,
            {
                "throttle_time": 0,
                "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "results_by_transaction": [],
            },
        )
    out = []
    for txn in body.transactions:
        results = await _add_partitions(
            ctx,
            request,
            str(txn.transactional_id),
            int(txn.producer_id),
            int(txn.producer_epoch),
            txn.topics,
            bool(txn.verify_only),
        )
        out.append({"transactional_id": txn.transactional_id, "topic_results": _by_topic(results)})
    return respond(
        request, {"throttle_time": 0, "error_code": ErrorCode.NONE, "results_by_transaction": out}
    )


async def handle_add_offsets_to_txn(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    if not _may_write(ctx, str(body.transactional_id)):
        return respond(request, {"throttle_time": 0, "error_code": TXN_REFUSED})
    if not ctx.allowed(READ, GROUP, str(body.group_id)):
        return respond(
            request, {"throttle_time": 0, "error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED}
        )
    error = await _coordinator(ctx).add_offsets(
        str(body.transactional_id),
        int(body.producer_id),
        int(body.producer_epoch),
        str(body.group_id),
    )
    return respond(request, {"throttle_time": 0, "error_code": _for_version(request, error)})


async def handle_end_txn(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    if not _may_write(ctx, str(body.transactional_id)):
        return respond(request, {"throttle_time": 0, "error_code": TXN_REFUSED})
    error = await _coordinator(ctx).end_txn(
        str(body.transactional_id),
        int(body.producer_id),
        int(body.producer_epoch),
        bool(body.committed),
    )
    return respond(request, {"throttle_time": 0, "error_code": _for_version(request, error)})


async def handle_txn_offset_commit(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    assert ctx.groups is not None, "the broker starts its coordinators before serving"
    commits = [
        OffsetCommit(
            str(t.name),
            int(p.partition_index),
            int(p.committed_offset),
            int(getattr(p, "committed_leader_epoch", -1)),
            p.committed_metadata,
        )
        for t in body.topics
        for p in t.partitions
    ]
    if not _may_write(ctx, str(body.transactional_id)):
        errors = [TXN_REFUSED] * len(commits)
    elif not ctx.allowed(READ, GROUP, str(body.group_id)):
        errors = [ErrorCode.GROUP_AUTHORIZATION_FAILED] * len(commits)
    else:
        readable = {c.topic for c in commits if ctx.allowed(READ, TOPIC, c.topic)}
        allowed = [c for c in commits if c.topic in readable]
        transactional_id = str(body.transactional_id)
        producer_id, producer_epoch = int(body.producer_id), int(body.producer_epoch)

        async def verify(offsets: TopicPartition) -> ErrorCode:
            verdict = await _coordinator(ctx).verify_partitions(
                transactional_id, producer_id, producer_epoch, [offsets]
            )
            error = verdict.get(offsets, ErrorCode.NONE)
            return tm.offset_commit_error_for_unverified(request.api_version, error)

        # as in Kafka, with no topic left the group is not asked at all
        done = iter(
            await ctx.groups.offsets.commit_txn(
                str(body.group_id),
                producer_id,
                producer_epoch,
                int(getattr(body, "generation_id", -1)),
                str(getattr(body, "member_id", "") or ""),
                getattr(body, "group_instance_id", None),
                allowed,
                verify,
            )
            if allowed
            else []
        )
        errors = [
            next(done) if c.topic in readable else ErrorCode.TOPIC_AUTHORIZATION_FAILED
            for c in commits
        ]
    topics: dict[str, list[dict[str, Any]]] = {}
    for c, error in zip(commits, errors, strict=True):
        topics.setdefault(c.topic, []).append(
            {"partition_index": c.partition, "error_code": _for_version(request, error)}
        )
    return respond(
        request,
        {
            "throttle_time": 0,
            "topics": [{"name": n, "partitions": parts} for n, parts in topics.items()],
        },
    )


async def handle_describe_transactions(ctx: BrokerContext, request: Request) -> Any:
    ids = [str(i) for i in request.body.transactional_ids]
    describable = {i for i in ids if ctx.allowed(DESCRIBE, ResourceType.TRANSACTIONAL_ID, i)}
    allowed = [i for i in ids if i in describable]
    done = iter(await _coordinator(ctx).describe(allowed) if allowed else [])
    described = [next(done) if i in describable else (i, TXN_REFUSED) for i in ids]
    states = []
    for txn_id, d in described:
        if isinstance(d, ErrorCode):
            # the rest left at the schema's zeros, as Kafka's TransactionCoordinator leaves it
            states.append(
                {
                    "error_code": d,
                    "transactional_id": txn_id,
                    "transaction_state": "",
                    "transaction_timeout": 0,
                    "transaction_start_time": EPOCH_TIME,
                    "producer_id": 0,
                    "producer_epoch": 0,
                    "topics": [],
                }
            )
            continue
        states.append(
            {
                "error_code": ErrorCode.NONE,
                "transactional_id": txn_id,
                "transaction_state": d.state,
                "transaction_timeout": d.txn_timeout_ms,
                # -1 (not started) is a time too here, not a null
                "transaction_start_time": d.txn_start_timestamp_ms
                if d.txn_start_timestamp_ms >= 0
                else NO_TIME,
                "producer_id": d.producer_id,
                "producer_epoch": d.producer_epoch,
                # only the topics the session may DESCRIBE
                "topics": [
                    {"topic": t, "partitions": list(ps)}
                    for t, ps in d.topics
                    if ctx.allowed(DESCRIBE, TOPIC, t)
                ],
            }
        )
    return respond(request, {"throttle_time": 0, "transaction_states": states})


async def handle_list_transactions(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    error, listed, unknown = await _coordinator(ctx).list(
        [str(s) for s in body.state_filters], [int(p) for p in body.producer_id_filters]
    )
    duration = int(getattr(body, "duration_filter", -1))
    if duration >= 0:  # v1 (KIP-994): only transactions older than this
        now = _coordinator(ctx).clock_ms()
        started = {
            txn_id: m.txn_start_timestamp_ms for txn_id, m in _coordinator(ctx).transactions.items()
        }
        # as Kafka's TransactionStateManager: an id with no transaction open has start time
        # -1, so it is listed whatever the duration (now - -1 is past any)
        listed = [t for t in listed if now - started.get(t.transactional_id, -1) > duration]
    listed = [
        t
        for t in listed
        if ctx.allowed(DESCRIBE, ResourceType.TRANSACTIONAL_ID, t.transactional_id)
    ]
    return respond(
        request,
        {
            "throttle_time": 0,
            "error_code": error,
            "unknown_state_filters": unknown,
            "transaction_states": [
                {
                    "transactional_id": t.transactional_id,
                    "producer_id": t.producer_id,
                    "transaction_state": t.state,
                }
                for t in listed
            ],
        },
    )


async def handle_write_txn_markers(ctx: BrokerContext, request: Request) -> Any:
    # what a transaction coordinator sends, or an operator's kafka-transactions.sh abort:
    # ALTER or CLUSTER_ACTION on the cluster (KIP-1037); a refusal is every partition's
    # error, as Kafka's
    refused = not (
        ctx.allowed_on_cluster(AclOperation.ALTER)
        or ctx.allowed_on_cluster(AclOperation.CLUSTER_ACTION)
    )
    out = []
    for marker in request.body.markers:
        topics = []
        for t in marker.topics:
            info = ctx.topics.get(str(t.name))
            parts = []
            for index in t.partition_indexes:
                error = ErrorCode.NONE
                if refused:
                    error = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
                elif info is None or not 0 <= int(index) < info.partitions:
                    error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    try:
                        partition = await ctx.replicas.partition(info, int(index))
                        started = await partition.append_marker(
                            int(marker.producer_id),
                            int(marker.producer_epoch),
                            int(marker.coordinator_epoch),
                            bool(marker.transaction_result),
                        )
                        if isinstance(started, AppendResult):
                            error = started.error
                        else:
                            await asyncio.shield(started.durable)
                            # acknowledged only by a broker not fenced meanwhile
                            error = await ctx.replicas.session_settled_soon()
                            fenced = error != ErrorCode.NONE
                            if not fenced and info.name == OFFSETS_TOPIC and ctx.groups is not None:
                                # offsets committed in the transaction count (or not) now
                                ctx.groups.offsets.complete_transaction(
                                    int(marker.producer_id),
                                    bool(marker.transaction_result),
                                    int(index),
                                )
                    except Exception as e:
                        error = partition_failed("write a marker to", info.name, int(index), e)
                parts.append({"partition_index": int(index), "error_code": error})
            topics.append({"name": t.name, "partitions": parts})
        out.append({"producer_id": marker.producer_id, "topics": topics})
    return respond(request, {"markers": out})


async def handle_describe_producers(ctx: BrokerContext, request: Request) -> Any:
    topics = []
    for t in request.body.topics:
        info = ctx.topics.get(str(t.name))
        readable = ctx.allowed(READ, TOPIC, str(t.name))
        parts = []
        for index in t.partition_indexes:
            entry: dict[str, Any] = {
                "partition_index": int(index),
                "error_code": ErrorCode.NONE,
                "error_message": None,
                "active_producers": [],
            }
            if not readable:
                entry["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif info is None or not 0 <= int(index) < info.partitions:
                entry["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                try:
                    partition = await ctx.replicas.partition(info, int(index))
                except Exception as e:
                    entry["error_code"] = partition_failed(
                        "describe producers of", info.name, int(index), e
                    )
                else:
                    state = partition.log.producer_state
                    entry["active_producers"] = [
                        {
                            "producer_id": e.producer_id,
                            "producer_epoch": e.producer_epoch,
                            "last_sequence": e.last_seq,
                            "last_timestamp": e.last_timestamp,
                            "coordinator_epoch": e.coordinator_epoch,
                            "current_txn_start_offset": e.current_txn_first_offset,
                        }
                        for e in state.entries()
                    ]
            parts.append(entry)
        topics.append({"name": t.name, "partitions": parts})
    return respond(request, {"throttle_time": 0, "topics": topics})


# Kafka 3.9's versions (EndTxn v5, TxnOffsetCommit v5: KIP-890 part 2, and ListTransactions
# v2: KIP-1152, are Kafka 4.0+). AddPartitionsToTxn v5 is v4 that may answer
# TRANSACTION_ABORTABLE, which verify_only does from v4 here as in Kafka 3.9. WriteTxnMarkers v0
# is v1 before flexible versions (its schema: ``protocol.schemas``).
HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.ADD_PARTITIONS_TO_TXN: (handle_add_partitions_to_txn, 0, 5),
    ApiKey.ADD_OFFSETS_TO_TXN: (handle_add_offsets_to_txn, 0, 4),
    ApiKey.END_TXN: (handle_end_txn, 0, 4),
    ApiKey.WRITE_TXN_MARKERS: (handle_write_txn_markers, 0, 1),
    ApiKey.DESCRIBE_PRODUCERS: (handle_describe_producers, 0, 0),
    ApiKey.TXN_OFFSET_COMMIT: (handle_txn_offset_commit, 0, 4),
    ApiKey.DESCRIBE_TRANSACTIONS: (handle_describe_transactions, 0, 0),
    ApiKey.LIST_TRANSACTIONS: (handle_list_transactions, 0, 1),
}
