"""A Produce response made ahead while its appends are in flight (``ProduceAnswer``): used
when the appends ended as expected, made again from their results when one did not."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from kafka.protocol.producer import ProduceResponse

from automq_py.apis.produce import ProduceAnswer
from automq_py.partition import AppendResult, PendingAppend
from automq_py.replica_manager import AppendEntry
from protocol import wire
from protocol.errors import ErrorCode

VERSION = 9  # librdkafka's
CTX: Any = None  # (v9 names no leader: the context is not asked)


def request(correlation_id: int = 7) -> Any:
    return SimpleNamespace(api_version=VERSION, correlation_id=correlation_id)


def entry(index: int) -> AppendEntry:
    return AppendEntry(None, index, None, ErrorCode.NONE, "t")


def decoded(buffers: list[wire.Buffer]) -> list[tuple[int, int, int, int]]:
    """Each partition's (index, error code, base offset, log start offset)."""
    raw = b"".join(bytes(b) for b in buffers)[4:]
    body = ProduceResponse.decode(raw, version=VERSION, header=True)
    return [
        (p.index, p.error_code, p.base_offset, p.log_start_offset)
        for t in body.responses
        for p in t.partition_responses
    ]


def ok(base: int, log_start: int = 0) -> AppendResult:
    return AppendResult(ErrorCode.NONE, base, log_start)


def test_appends_that_succeed_are_answered_with_the_response_made_ahead() -> None:
    answer = ProduceAnswer(CTX, request(), ["t"], [entry(3)], [ok(100)], 0)
    answer.prepare()
    made = answer.made
    assert made is not None and decoded(made) == [(3, 0, 100, 0)]
    # the log start offset moved meanwhile: the answer is the one at the append, as Kafka's
    assert answer.finish([ok(100, 40)]) is made


async def test_a_pending_append_is_answered_with_its_offsets_and_the_log_start_at_prepare() -> None:
    partition: Any = SimpleNamespace(log_start_offset=5)
    durable = asyncio.get_running_loop().create_future()
    answer = ProduceAnswer(
        CTX, request(), ["t"], [entry(2)], [PendingAppend(durable, 42, partition)], 0
    )
    answer.prepare()
    made = answer.made
    assert made is not None and decoded(made) == [(2, 0, 42, 5)]
    partition.log_start_offset = 7
    durable.set_result(None)
    assert answer.finish([AppendResult(ErrorCode.NONE, 42, 7)]) is made


def test_an_append_that_did_not_succeed_is_answered_from_its_result() -> None:
    answer = ProduceAnswer(CTX, request(), ["t", "t"], [entry(0), entry(1)], [ok(10), ok(20)], 0)
    answer.prepare()
    done = [ok(10), AppendResult(ErrorCode.REQUEST_TIMED_OUT)]
    response = answer.finish(done)
    assert response is not answer.made
    assert decoded(response) == [(0, 0, 10, 0), (1, ErrorCode.REQUEST_TIMED_OUT, -1, -1)]


def test_an_answer_not_made_ahead_is_made_from_the_results() -> None:
    answer = ProduceAnswer(CTX, request(), ["t"], [entry(5)], [ok(100)], 0)
    assert decoded(answer.finish([ok(100, 40)])) == [(5, 0, 100, 40)]


def test_a_request_of_a_batch_reads_its_own_results() -> None:
    expected = [ok(1), ok(2), AppendResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
    # the second request of a batch: partitions 1 and 2 of the batch's results
    answer = ProduceAnswer(CTX, request(), ["t", "t"], [entry(1), entry(2)], expected[1:], 0, 1)
    answer.prepare()
    made = answer.made
    assert made is not None
    assert decoded(made) == [(1, 0, 2, 0), (2, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)]
    assert answer.finish(expected) is made
    failed = [ok(1), AppendResult(ErrorCode.KAFKA_STORAGE_ERROR), expected[2]]
    assert decoded(answer.finish(failed))[0] == (1, ErrorCode.KAFKA_STORAGE_ERROR, -1, -1)
