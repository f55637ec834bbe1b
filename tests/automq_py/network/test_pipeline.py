"""Pipelined requests on one connection (the socket server's response queue, the produce
path's deferred responses): answered in request order, offsets assigned in request order,
nothing acknowledged lost to a kill -9 in the middle of a pipeline."""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from protocol.records import RecordInput, build_batch, parse_records
from tests.automq_py.clients.test_clients import create_topic
from tests.support.broker import BrokerProcess
from tests.support.raw_connection import RawConnection, fetch_request, partition_produce_request
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

TOPIC = "pipe"
PARTITIONS = 3
LATEST = -1


@pytest.fixture(scope="module")
def pipeline_broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(
        tmp_path_factory.mktemp("pipeline"),
        {"s3.data.buckets": s3_server.url(), "cluster.id": f"pipe{time.monotonic_ns()}"},
    )
    broker.start()
    try:
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        yield broker
    finally:
        assert broker.stop() == 0, broker.log_tail()


def produce_request(acks: int, batches: dict[int, bytes]) -> Any:
    topic = ProduceRequest.TopicProduceData
    return ProduceRequest[7](
        acks=acks,
        timeout_ms=30000,
        topic_data=[
            topic(
                name=TOPIC,
                partition_data=[
                    topic.PartitionProduceData(index=p, records=b) for p, b in batches.items()
                ],
            )
        ],
    )


def list_offsets_request(partitions: list[int]) -> Any:
    t = ListOffsetsRequest.ListOffsetsTopic
    return ListOffsetsRequest[1](
        replica_id=-1,
        topics=[
            t(
                name=TOPIC,
                partitions=[
                    t.ListOffsetsPartition(partition_index=p, timestamp=LATEST) for p in partitions
                ],
            )
        ],
    )


def end_offsets(conn: RawConnection) -> dict[int, int]:
    response = conn.call(list_offsets_request(list(range(PARTITIONS))), ListOffsetsResponse)
    return {p.partition_index: p.offset for p in response.topics[0].partitions}


def read_values(conn: RawConnection, starts: dict[int, int], ends: dict[int, int]) -> dict:
    """Every record value of each partition in ``[start, end)``, in offset order."""
    got: dict[int, list[bytes]] = {p: [] for p in starts}
    offsets = dict(starts)
    while any(offsets[p] < ends[p] for p in offsets):
        wanted = {p: o for p, o in offsets.items() if o < ends[p]}
        response = conn.call(fetch_request(TOPIC, wanted, max_wait_ms=500), FetchResponse)
        for part in response.responses[0].partitions:
            assert part.error_code == 0, part
            data = memoryview(part.records or b"")
            pos = 0
            while pos + 12 <= len(data):
                size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
                for record in parse_records(data[pos : pos + size]):
                    if offsets[part.partition_index] <= record.offset < ends[part.partition_index]:
                        assert record.offset == offsets[part.partition_index]
                        got[part.partition_index].append(record.value)
                        offsets[part.partition_index] += 1
                pos += size
    return got


# one request of the pipeline: ("produce", acks, {partition: records}), ("metadata",),
# ("versions",), ("offsets", partitions), ("fetch", partitions, max_wait_ms)
produce_op = st.tuples(
    st.just("produce"),
    st.sampled_from([-1, 1, 0]),
    st.dictionaries(
        st.integers(0, PARTITIONS - 1), st.integers(1, 4), min_size=1, max_size=PARTITIONS
    ),
)
other_op = st.one_of(
    st.tuples(st.just("metadata")),
    st.tuples(st.just("versions")),
    st.tuples(st.just("offsets"), st.lists(st.integers(0, PARTITIONS - 1), min_size=1, max_size=3)),
    st.tuples(
        st.just("fetch"),
        st.lists(st.integers(0, PARTITIONS - 1), min_size=1, max_size=3, unique=True),
        st.sampled_from([0, 20]),
    ),
)
pipelines = st.lists(st.one_of(produce_op, produce_op, other_op), min_size=1, max_size=40)
_examples = itertools.count()


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=pipelines)
def test_pipelined_requests_are_answered_in_request_order(
    pipeline_broker: BrokerProcess, ops: list[tuple]
) -> None:
    example = next(_examples)
    conn = RawConnection(pipeline_broker.bootstrap)
    try:
        start = end_offsets(conn)
        # what the log must hold afterwards, and what each request must be answered with
        assigned = dict(start)
        values: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        sent: list[tuple[int, Any, Any, tuple, dict[int, int]]] = []
        data = bytearray()
        for i, op in enumerate(ops):
            bases: dict[int, int] = {}
            if op[0] == "produce":
                _, acks, counts = op
                batches = {}
                for p, n in counts.items():
                    vs = [f"{example}/{i}/{p}/{k}".encode() for k in range(n)]
                    batches[p] = bytes(build_batch([RecordInput(v) for v in vs]))
                    bases[p] = assigned[p]
                    assigned[p] += n
                    values[p].extend(vs)
                request, response_class = produce_request(acks, batches), ProduceResponse
            elif op[0] == "metadata":
                request = MetadataRequest[1](
                    topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)]
                )
                response_class = MetadataResponse
            elif op[0] == "versions":
                request, response_class = ApiVersionsRequest[0](), ApiVersionsResponse
            elif op[0] == "offsets":
                request = list_offsets_request(sorted(set(op[1])))
                response_class = ListOffsetsResponse
            else:
                request = fetch_request(TOPIC, {p: start[p] for p in op[1]}, max_wait_ms=op[2])
                response_class = FetchResponse
            correlation_id, frame = conn.frame(request)
            data += frame
            if not (op[0] == "produce" and op[1] == 0):
                sent.append((correlation_id, request, response_class, op, bases))
        conn.send(bytes(data))  # the whole pipeline at once

        acked = dict(start)  # the end of what acknowledged produces wrote, per partition
        for expected_id, request, response_class, op, bases in sent:
            correlation_id, response = conn.receive(request, response_class)
            assert correlation_id == expected_id, (op, correlation_id, expected_id)
            if op[0] == "produce":
                for part in response.responses[0].partition_responses:
                    assert part.error_code == 0, part
                    assert part.base_offset == bases[part.index], (op, part)
                    acked[part.index] = max(
                        acked[part.index], bases[part.index] + op[2][part.index]
                    )
            elif op[0] == "offsets":
                for part in response.topics[0].partitions:
                    # every earlier produce is visible (an acks=0 one may not be durable yet)
                    assert acked[part.partition_index] <= part.offset, (op, part, acked)
                    assert part.offset <= assigned[part.partition_index]
            elif op[0] == "fetch":
                for part in response.responses[0].partitions:
                    assert part.error_code == 0, part
                    assert acked[part.partition_index] <= part.high_watermark, (op, part, acked)
            elif op[0] == "metadata":
                assert [t.name for t in response.topics] == [TOPIC]

        # acks=0 appends are not answered: wait until the log holds everything sent
        deadline = time.monotonic() + 10
        while end_offsets(conn) != assigned and time.monotonic() < deadline:
            time.sleep(0.02)
        assert end_offsets(conn) == assigned
        assert read_values(conn, start, assigned) == values
    finally:
        conn.close()


WINDOW = 32


def test_kill_9_during_pipelined_produce_loses_nothing_acknowledged(
    tmp_path: Path, s3_server: SeaweedFS
) -> None:
    broker = BrokerProcess(
        tmp_path / "broker",
        {"s3.data.buckets": s3_server.url(), "cluster.id": f"pipekill{time.monotonic_ns()}"},
    )
    broker.start()
    try:
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        conn = RawConnection(broker.bootstrap)
        acked: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}
        in_flight: list[tuple[Any, dict[int, list[bytes]]]] = []
        window = threading.Semaphore(WINDOW)
        stop = threading.Event()
        errors: list[BaseException] = []

        def read_responses() -> None:
            try:
                while True:
                    while not in_flight:
                        if stop.is_set():
                            return
                        time.sleep(0.001)
                    request, sent = in_flight[0]
                    _, response = conn.receive(request, ProduceResponse)
                    in_flight.pop(0)
                    window.release()
                    for part in response.responses[0].partition_responses:
                        assert part.error_code == 0, part
                        for k, v in enumerate(sent[part.index]):
                            acked[part.index][part.base_offset + k] = v
            except (ConnectionError, OSError) as e:
                errors.append(e)

        reader = threading.Thread(target=read_responses, daemon=True)
        reader.start()
        killer = threading.Timer(1.5, broker.kill)
        killer.start()
        n = 0
        try:
            while reader.is_alive():
                if not window.acquire(timeout=0.1):
                    continue
                sent = {
                    p: [f"r{n}/{p}/{k}".encode() + b"x" * 200 for k in range(5)]
                    for p in range(PARTITIONS)
                }
                batches = {
                    p: bytes(build_batch([RecordInput(v) for v in vs])) for p, vs in sent.items()
                }
                request = produce_request(-1, batches)
                _, frame = conn.frame(request)
                in_flight.append((request, sent))
                conn.send(frame)
                n += 1
        except OSError:
            pass  # the broker died under the writer
        stop.set()
        killer.join()
        reader.join(10)
        conn.close()
        assert errors, "the broker was killed: the reader must have seen the connection end"
        total = sum(len(a) for a in acked.values())
        assert total > 5 * PARTITIONS * 10, f"only {total} records acknowledged before the kill"

        broker.start()
        conn = RawConnection(broker.bootstrap)
        try:
            ends = end_offsets(conn)
            for p in range(PARTITIONS):
                assert ends[p] >= max(acked[p]) + 1
            got = read_values(conn, dict.fromkeys(range(PARTITIONS), 0), ends)
        finally:
            conn.close()
        for p in range(PARTITIONS):
            for offset, value in acked[p].items():
                assert got[p][offset] == value, (p, offset)
    finally:
        broker.stop()


@pytest.mark.parametrize("version", [7, 9])
def test_a_burst_of_produce_requests_read_together_is_answered_request_by_request(
    pipeline_broker: BrokerProcess, version: int
) -> None:
    """librdkafka sends a request per partition, a burst of them in one write; the broker
    handles those it reads together as one append, and still answers each request on its
    own: its own correlation id, its partitions' errors, offsets in request order."""
    conn = RawConnection(pipeline_broker.bootstrap)
    try:
        start = end_offsets(conn)
        values = [f"burst/{version}/{k}".encode() for k in range(5)]
        corrupt = bytearray(build_batch([RecordInput(b"corrupt")]))
        corrupt[-1] ^= 0xFF  # a record byte under the CRC
        ok = [bytes(build_batch([RecordInput(v) for v in values[:n]])) for n in (1, 2, 3)]
        # (request, the error it must be answered with, partition, records it appends)
        produce = functools.partial(partition_produce_request, version=version)
        burst = [
            (produce(TOPIC, 0, ok[1]), 0, 0, 2),
            (produce("no-such-topic", 0, ok[0]), 3, 0, 0),
            (produce(TOPIC, 1, ok[0]), 0, 1, 1),
            (produce(TOPIC, 99, ok[0]), 3, 99, 0),
            (produce(TOPIC, 2, bytes(corrupt)), 2, 2, 0),
            (produce(TOPIC, 0, ok[2], timeout_ms=5000), 0, 0, 3),
            (produce(TOPIC, 2, ok[1], acks=1), 0, 2, 2),
            (produce(TOPIC, 1, ok[1]), 0, 1, 2),
        ]
        ids = conn.send_together([request for request, *_ in burst])
        expected = dict(start)
        for (request, error, partition, count), expected_id in zip(burst, ids, strict=True):
            correlation_id, response = conn.receive(request, ProduceResponse)
            assert correlation_id == expected_id
            [topic] = response.responses
            [part] = topic.partition_responses
            assert (part.index, part.error_code) == (partition, error), (request, part)
            if error == 0:
                assert part.base_offset == expected[partition], (request, part)
                expected[partition] += count
        assert end_offsets(conn) == expected
    finally:
        conn.close()


@pytest.mark.parametrize("bad", ["truncated", "unknown version"])
def test_a_malformed_request_inside_a_burst_closes_only_its_connection(
    pipeline_broker: BrokerProcess, bad: str
) -> None:
    """The requests of a burst before a malformed one are handled (their records land, in
    order); the malformed one closes the connection; the broker serves on."""
    conn = RawConnection(pipeline_broker.bootstrap)
    try:
        start = end_offsets(conn)
        values = {p: f"before-{bad}-{p}".encode() for p in range(PARTITIONS)}
        data = bytearray()
        for p, value in values.items():
            request = partition_produce_request(TOPIC, p, bytes(build_batch([RecordInput(value)])))
            data += conn.frame(request)[1]
        frame = bytearray(conn.frame(partition_produce_request(TOPIC, 0, b"x" * 64))[1])
        if bad == "truncated":
            frame = frame[:-40]
            frame[:4] = (len(frame) - 4).to_bytes(4, "big")
        else:
            frame[6:8] = (99).to_bytes(2, "big")  # Produce v99
        conn.send(bytes(data + frame))
        conn.sock.settimeout(15)
        while conn.sock.recv(65536):  # (what answers come before the end)
            pass
    finally:
        conn.close()
    conn = RawConnection(pipeline_broker.bootstrap)
    try:
        expected = {p: start[p] + 1 for p in range(PARTITIONS)}
        deadline = time.monotonic() + 10
        while end_offsets(conn) != expected and time.monotonic() < deadline:
            time.sleep(0.02)
        assert end_offsets(conn) == expected
        got = read_values(conn, start, expected)
        assert got == {p: [values[p]] for p in range(PARTITIONS)}
    finally:
        conn.close()
