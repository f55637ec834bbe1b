"""Produce (0): resolve each partition's topic, then hand the records to the ReplicaManager.

Every acknowledgement (acks=1 and acks=all alike) is sent after the data is fsynced in the WAL,
which is what acks=all promises; acks=0 gets no response at all. The handler returns as soon
as every partition's append has started (offsets assigned, WAL writes queued), with the
response still to come (:class:`Deferred`): the connection goes on to its next request while
this one waits for durability, and the socket server writes the responses in request order.

The Produce requests a connection read together may be handled as one append
(:func:`handle_produce_batch`, librdkafka's burst of a request per partition): the appends'
future, timeout and acknowledgement are then shared, each request keeps its own response.

Transactional batches are verified first (KIP-890 part 1, Kafka's
``transaction.partition.verification.enable``): where the producer has no open transaction in
the partition yet, the transaction coordinator must have the partition in the producer's
transaction, or the partition is answered INVALID_TXN_STATE (TRANSACTION_ABORTABLE from Produce
v11): a late write of a transaction already decided never opens a transaction nobody will
close. A verification the coordinator could not answer (unavailable, loading, moved, or busy
completing the transaction) is answered NOT_ENOUGH_REPLICAS, which every client retries, as
Kafka's brokers answer it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from automq_py.apis.context import BrokerContext, CloseConnection
from automq_py.apis.deferred import Deferred
from automq_py.coordinator import transaction_metadata as tm
from automq_py.partition import AppendResult, PendingAppend
from automq_py.producer_state import OPEN_TXN_GUARD
from automq_py.replica_manager import AppendEntry
from automq_py.security.acls import AclOperation, ResourceType
from automq_py.security.quotas import PRODUCE as PRODUCE_QUOTA
from automq_py.security.session import SESSION, THROTTLE_MS
from protocol import record_batch, wire
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request
from protocol.produce import (
    FIRST_LEADER_HINT_VERSION,
    ProducePartitionResponse,
    encode_produce_response,
    records_error,
)
from protocol.record_batch import InvalidRecordBatchError

# the low byte of a batch's attributes (big-endian int16), which holds the transactional bit
_ATTRIBUTES_LOW = record_batch.ATTRIBUTES_OFFSET + 1


async def handle_produce(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    # as Kafka: the transactional id is checked only for transactional records, and those are
    # refused without one (no coordinator would ever end the transaction they would open)
    if _has_transactional_batch(body) and (
        body.transactional_id is None
        or not ctx.allowed(
            AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, str(body.transactional_id)
        )
    ):
        return _refused(request, body, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    names, entries = await _entries(ctx, request)
    if body.transactional_id is not None and ctx.transactions is not None:
        entries = await _verify_transactional(ctx, request, str(body.transactional_id), entries)
    throttle = _throttle(ctx, request)
    listeners: list[Callable[[], object]] = []  # the response's writer, once it is queued
    appends: list[AppendResult | PendingAppend] = []
    results = await ctx.replicas.append_records(
        entries,
        acks=body.acks,
        internal_allowed=False,
        timeout_ms=body.timeout_ms,
        listeners=listeners,
        appends=appends,
    )
    if body.acks == 0:
        failed = {
            entry.key: started.error.name
            for entry, started in zip(entries, appends, strict=True)
            if isinstance(started, AppendResult) and started.error != ErrorCode.NONE
        }
        if failed:
            # no response can say it: Kafka closes the connection, and the producer refreshes
            # its metadata (a leader moved, a topic gone) instead of writing on into the void
            raise CloseConnection(
                f"Produce with acks=0 (correlation id {request.correlation_id}) failed: {failed}"
            )
        return None
    if results.done():
        return _response(ctx, request, names, entries, results.result(), throttle)
    answer = ProduceAnswer(ctx, request, names, entries, appends, throttle)
    return Deferred(results, answer.finish, listeners, answer.prepare)


def joins_batch(ctx: BrokerContext, first: Request, request: Request) -> bool:
    """Whether ``request`` (a Produce request) may be handled in one append with ``first``
    (:func:`handle_produce_batch`): both expect a response after the same wait (acks 1 or
    all, the same timeout), neither is transactional (its partitions are verified per
    request) and no produce or request quota is in force (each request's bytes and time count
    against it apart)."""
    body, head = request.body, first.body
    quotas = ctx.quotas
    return (
        body.acks == head.acks
        and body.acks != 0
        and body.timeout_ms == head.timeout_ms
        and body.transactional_id is None
        and head.transactional_id is None
        and (quotas is None or not quotas.any)
    )


async def handle_produce_batch(ctx: BrokerContext, requests: list[Request]) -> list[Any]:
    """Handle Produce ``requests`` read together (librdkafka sends one per partition, a burst
    of them at once; each pair passes :func:`joins_batch`) as one append of all their
    partitions, in request order: one future, one timeout and one acknowledgement for them
    all, the work a single request of every partition would take. Each request still gets its
    own response, as :func:`handle_produce` would give it."""
    names: list[str] = []
    entries: list[AppendEntry] = []
    bounds: list[int] = [0]
    for request in requests:
        request_names, request_entries = await _entries(ctx, request)
        names += request_names
        entries += request_entries
        bounds.append(len(entries))
    head = requests[0].body
    listeners: list[Callable[[], object]] = []
    appends: list[AppendResult | PendingAppend] = []
    results = await ctx.replicas.append_records(
        entries,
        acks=head.acks,
        internal_allowed=False,
        timeout_ms=head.timeout_ms,
        listeners=listeners,
        appends=appends,
    )
    out: list[Any] = []
    for i, request in enumerate(requests):
        a, b = bounds[i], bounds[i + 1]
        if results.done():
            out.append(_response(ctx, request, names[a:b], entries[a:b], results.result()[a:b]))
        else:
            answer = ProduceAnswer(ctx, request, names[a:b], entries[a:b], appends[a:b], 0, a)
            out.append(Deferred(results, answer.finish, listeners, answer.prepare))
    return out


class ProduceAnswer:
    """The response to come of ``request``, whose partitions are those from ``first`` on of
    its append's results: made once they are all durable (``finish``), or ahead (``prepare``,
    while the connection waits for the WAL write) from the results they will have if every
    append that started succeeds, and then used if they did."""

    __slots__ = (
        "appends",
        "ctx",
        "entries",
        "expected",
        "first",
        "made",
        "names",
        "request",
        "throttle_ms",
    )

    def __init__(
        self,
        ctx: BrokerContext,
        request: Request,
        names: list[str],
        entries: list[AppendEntry],
        appends: list[AppendResult | PendingAppend],
        throttle_ms: int,
        first: int = 0,
    ) -> None:
        self.ctx = ctx
        self.request = request
        self.names = names
        self.entries = entries
        self.appends = appends  # how each partition's append started
        self.throttle_ms = throttle_ms
        self.first = first
        self.expected: list[AppendResult] = []
        self.made: list[wire.Buffer] | None = None

    def prepare(self) -> None:
        self.expected = [
            a if isinstance(a, AppendResult) else a.expected_result() for a in self.appends
        ]
        self.made = _response(
            self.ctx, self.request, self.names, self.entries, self.expected, self.throttle_ms
        )

    def finish(self, done: list[AppendResult]) -> list[wire.Buffer]:
        results = done[self.first : self.first + len(self.entries)]
        made = self.made
        # the same errors as expected: the same response (an append that was to succeed did;
        # the others' results are the very ones expected)
        if made is not None and all(
            r.error == e.error for r, e in zip(results, self.expected, strict=True)
        ):
            return made
        return _response(
            self.ctx, self.request, self.names, self.entries, results, self.throttle_ms
        )


async def _entries(ctx: BrokerContext, request: Request) -> tuple[list[str], list[AppendEntry]]:
    """Each partition of ``request`` with its topic resolved (or the error that answers it),
    and its topic's name."""
    names: list[str] = []
    entries: list[AppendEntry] = []
    for t in request.body.topics:
        name = t.name
        topic = None
        error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if name and not ctx.allowed(AclOperation.WRITE, ResourceType.TOPIC, str(name)):
            error = ErrorCode.TOPIC_AUTHORIZATION_FAILED  # (whether the topic exists or not)
        elif name:
            # as in Kafka, only Metadata auto-creates topics; Produce to an unknown one is an error
            topic, error = await ctx.topic_for_write(name, auto_create=False)
        for p in t.partitions:
            names.append(str(name))
            entry = AppendEntry(topic, p.index, p.records, error, str(name))
            if topic is not None and 0 <= p.index < topic.partitions:
                # Kafka checks the request's own rules once the partition is known to exist
                refused = records_error(request.api_version, p.records)
                if refused is not None:
                    code, message = refused
                    entry = AppendEntry(None, p.index, p.records, code, str(name), message)
            entries.append(entry)
    return names, entries


def _has_transactional_batch(body: Any) -> bool:
    """Whether a partition's records hold a transactional magic-v2 batch (its first: a
    Produce request carries one batch a partition, :func:`records_error`)."""
    for t in body.topics:
        for p in t.partitions:
            records = p.records
            if (
                records is not None
                and len(records) > _ATTRIBUTES_LOW
                and records[record_batch.MAGIC_OFFSET] == 2
                and records[_ATTRIBUTES_LOW] & record_batch.TRANSACTIONAL_BIT
            ):
                return True
    return False


def _throttle(ctx: BrokerContext, request: Request) -> int:
    """Record the request's bytes against the client's produce quota, if any: the time it is
    throttled for (0: within its quota)."""
    quotas = ctx.quotas
    if quotas is None or not quotas.any:
        return 0
    size = sum(
        len(p.records) for t in request.body.topics for p in t.partitions if p.records is not None
    )
    client_id = request.header.client_id or ""
    throttle = quotas.record(PRODUCE_QUOTA, SESSION.get().user, client_id, size)
    if throttle:
        THROTTLE_MS.set(throttle)
    return throttle


async def _verify_transactional(
    ctx: BrokerContext, request: Request, transactional_id: str, entries: list[AppendEntry]
) -> list[AppendEntry]:
    """``entries`` with the partitions the coordinator does not vouch for turned into errors,
    and those it does holding their verification's guard (taken before the coordinator is
    asked: a marker meanwhile ends it, and the append is refused)."""
    assert ctx.transactions is not None
    unverified: dict[tuple[int, int], list[int]] = {}  # (producer id, epoch) -> entry indexes
    out = list(entries)
    now_ms = int(time.time() * 1000)
    for i, entry in enumerate(entries):
        if entry.topic is None or entry.records is None:
            continue
        try:
            header = record_batch.parse_header(entry.records)
        except InvalidRecordBatchError:
            continue  # the append reports it
        if not header.is_transactional or header.producer_id < 0:
            continue
        try:
            partition = await ctx.replicas.partition(entry.topic, entry.index)
        except Exception:
            continue  # the append reports it
        state = partition.log.producer_state
        guard = state.verification_guard(header.producer_id, now_ms)
        out[i] = dataclasses.replace(entry, guard=guard)
        if guard is not OPEN_TXN_GUARD:
            unverified.setdefault((header.producer_id, header.producer_epoch), []).append(i)
    for (producer_id, epoch), indexes in unverified.items():
        wanted = {}
        for i in indexes:
            topic = out[i].topic
            if topic is not None:
                wanted[(topic.name, out[i].index)] = i
        verdict = await ctx.transactions.verify_partitions(
            transactional_id, producer_id, epoch, list(wanted)
        )
        for tp, error in verdict.items():
            if error != ErrorCode.NONE:
                i = wanted[tp]
                code, message = tm.produce_error_for_unverified(request.api_version, error)
                out[i] = AppendEntry(None, out[i].index, out[i].records, code, tp[0], message)
    return out


def _refused(request: Request, body: Any, code: ErrorCode) -> list[wire.Buffer] | None:
    """Every partition of the request answered ``code``; for acks=0 the connection is closed,
    as Kafka closes it for a request it refuses whole (the client has no answer to read)."""
    if body.acks == 0:
        raise CloseConnection(f"acks=0 Produce refused: {code.name}")
    topics = [
        (
            str(t.name),
            [ProducePartitionResponse(p.index, code, -1, -1, -1, None) for p in t.partitions],
        )
        for t in body.topics
    ]
    return encode_produce_response(request.api_version, request.correlation_id, topics)


def _response(
    ctx: BrokerContext,
    request: Request,
    names: list[str],
    entries: list[AppendEntry],
    results: list[AppendResult],
    throttle_ms: int = 0,
) -> list[wire.Buffer]:
    """The response; from v10 a partition answered NOT_LEADER_OR_FOLLOWER names its current
    leader, whose address the response carries (KIP-951, as Kafka's handleProduceRequest)."""
    hints = request.api_version >= FIRST_LEADER_HINT_VERSION
    leaders: set[int] = set()
    by_topic: dict[str, list[ProducePartitionResponse]] = {}
    for name, entry, r in zip(names, entries, results, strict=True):
        leader = None
        if hints and r.error == ErrorCode.NOT_LEADER_OR_FOLLOWER and entry.topic is not None:
            leader = ctx.leader_hint(entry.topic.name, entry.index)
            if leader is not None:
                leaders.add(leader[0])
        by_topic.setdefault(name, []).append(
            ProducePartitionResponse(
                entry.index,
                r.error,
                r.base_offset,
                r.log_append_time_ms,
                r.log_start_offset,
                r.message,
                r.record_errors,
                leader,
            )
        )
    return encode_produce_response(
        request.api_version,
        request.correlation_id,
        list(by_topic.items()),
        throttle_ms,
        ctx.node_endpoints(leaders) if leaders else (),
    )


API_KEY = ApiKey.PRODUCE
# Kafka 3.9's maximum (11); the minimum is 3, not Kafka 3.9's 0: v0-v2 carry magic v0/v1
# message sets, which this broker does not store (Kafka 4.0 dropped them too, KIP-896).
HANDLERS: dict[int, tuple[Any, int, int]] = {API_KEY: (handle_produce, 3, 11)}
