"""Fuzzing the live broker process over raw sockets: no frame may crash or wedge it.

Each example starts from a well-formed request frame (built by kafka-python 3's independent
``kafka.protocol`` encoder; Produce carries a real record batch), mutates it (bit flips,
truncation, overwritten integers, huge array counts, random tails, a wrong size prefix,
garbage after the frame), sends it on a fresh connection and reads whatever comes back, or the
close. Then the broker process must still be running and a new connection must still get
well-formed ApiVersions and Metadata answers. Size prefixes that are negative or above
``socket.request.max.bytes`` must close the connection at once. One broker takes the examples of
every test.

``test_create_topics_refuses_absurd_partition_counts`` pins a broker bug found while fuzzing
CreateTopics values; it fails until the broker bounds partition counts.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from kafka.protocol.admin import (  # type: ignore[import-untyped]
    CreateTopicsRequest,
    CreateTopicsResponse,
    UpdateFeaturesRequest,
)
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest  # type: ignore[import-untyped]
from kafka.protocol.metadata import (  # type: ignore[import-untyped]
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import ProduceRequest  # type: ignore[import-untyped]

from protocol.records import Compression, RecordInput, build_batch
from tests.automq_py.conftest import module_broker
from tests.protocol.kafka_oracle import request_frame
from tests.support.broker import BrokerProcess
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

TOPIC = "fuzz"
# The broker's default socket.request.max.bytes.
MAX_REQUEST_BYTES = 104_857_600
# A mutated request may legitimately get no answer (acks=0, an announced size never sent, a
# long-poll Fetch): wait this long for one, then move on.
READ_TIMEOUT_S = 0.3
# A healthy broker answers ApiVersions/Metadata in milliseconds; this long means it is wedged.
HEALTH_TIMEOUT_S = 10.0

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

BATCH = bytes(
    build_batch(
        [
            RecordInput(b"value-%d" % i, b"key", [("h", b"v")], 1_700_000_000_000 + i)
            for i in range(3)
        ],
        compression=Compression.GZIP,
    )
)


def _client_payloads() -> list[bytes]:
    """Header + body of well-formed client requests (ApiVersions, Metadata, Produce, Fetch...)."""
    produce_topic = ProduceRequest.TopicProduceData(
        name=TOPIC,
        topic_id=uuid.UUID(int=0),
        partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=BATCH)
        ],
    )
    fetch_partition = FetchRequest.FetchTopic.FetchPartition(
        partition=0, fetch_offset=0, partition_max_bytes=1 << 20
    )
    list_offsets_partition = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
        partition_index=0, timestamp=-2
    )
    messages: list[Any] = [
        ApiVersionsRequest[3](client_software_name="fuzz", client_software_version="1"),
        ApiVersionsRequest[0](),
        MetadataRequest[12](topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)]),
        MetadataRequest[1](topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)]),
        ProduceRequest[9](acks=-1, timeout_ms=1000, topic_data=[produce_topic]),
        ProduceRequest[3](acks=1, timeout_ms=1000, topic_data=[produce_topic]),
        FetchRequest[12](
            max_wait_ms=10,
            min_bytes=1,
            topics=[FetchRequest.FetchTopic(topic=TOPIC, partitions=[fetch_partition])],
            forgotten_topics_data=[],
        ),
        FetchRequest[4](
            max_wait_ms=10,
            min_bytes=1,
            topics=[FetchRequest.FetchTopic(topic=TOPIC, partitions=[fetch_partition])],
        ),
        ListOffsetsRequest[7](
            replica_id=-1,
            topics=[
                ListOffsetsRequest.ListOffsetsTopic(name=TOPIC, partitions=[list_offsets_partition])
            ],
        ),
        # changes nothing as sent; mutated, any level or upgrade type
        UpdateFeaturesRequest[1](
            timeout_ms=1000,
            feature_updates=[
                UpdateFeaturesRequest.FeatureUpdateKey(
                    feature="group.version", max_version_level=1, upgrade_type=1
                )
            ],
            validate_only=False,
        ),
    ]
    return [request_frame(m, correlation_id=n + 1) for n, m in enumerate(messages)]


def create_topics_payload(
    name: str, partitions: int, version: int = 5, correlation_id: int = 7
) -> bytes:
    topic = CreateTopicsRequest.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=1, assignments=[], configs=[]
    )
    message = CreateTopicsRequest[version](topics=[topic], timeout_ms=5000)
    return request_frame(message, correlation_id=correlation_id)


CLIENT_PAYLOADS = _client_payloads()
# Kept apart from the Metadata seeds: a mutated CreateTopics can be accepted with an absurd
# partition count (see test_create_topics_refuses_absurd_partition_counts), and a mutated
# all-topics Metadata on the same broker would then exhaust the machine's memory.
ADMIN_PAYLOADS = [
    CLIENT_PAYLOADS[0],
    create_topics_payload("fuzz-new", 1, 5, correlation_id=101),
    create_topics_payload("fuzz-new2", 2, 7, correlation_id=102),
]
# Values that, written over a length or count, stress the decoder's bounds checks.
INT32S = [-2, -1, 0, 1, 0x7FFFFFFF, -(1 << 31), 1 << 20, MAX_REQUEST_BYTES]
INT16S = [-2, -1, 0, 0x7FFF]
HUGE_VARINT = b"\xff\xff\xff\xff\x0f"  # unsigned varint 0xFFFFFFFF: a compact array/string length


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


@st.composite
def mutated_frames(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A seed payload, mutated 1-4 times, framed, then maybe its framing broken."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(
            st.sampled_from(
                ["flip", "truncate", "int32", "int16", "byte", "insert", "varint", "tail"]
            )
        )
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "int32" and pos + 4 <= len(data):
            struct.pack_into(">i", data, pos, draw(st.sampled_from(INT32S)))
        elif kind == "int16" and pos + 2 <= len(data):
            struct.pack_into(">h", data, pos, draw(st.sampled_from(INT16S)))
        elif kind == "byte" and data:
            data[pos] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF]))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "varint":
            data[pos : pos + 1] = HUGE_VARINT
        elif kind == "tail":
            data += draw(st.binary(min_size=1, max_size=64))
    out = bytearray(frame(bytes(data)))
    framing = draw(st.sampled_from(["keep", "keep", "keep", "size", "after"]))
    if framing == "size":
        size = draw(
            st.one_of(
                st.integers(-4, 4).map(lambda d: len(data) + d),
                st.sampled_from([-1, 0, MAX_REQUEST_BYTES, MAX_REQUEST_BYTES + 1, 0x7FFFFFFF]),
            )
        )
        struct.pack_into(">i", out, 0, size)
    elif framing == "after":
        out += draw(st.binary(min_size=1, max_size=16))
    return bytes(out)


def exchange(port: int, data: bytes, timeout: float = READ_TIMEOUT_S) -> tuple[bytes, bool]:
    """Send ``data`` on a fresh connection; return what came back and whether it was closed.

    Stops at the first complete response frame, at the close, or after ``timeout``.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=HEALTH_TIMEOUT_S) as sock:
        try:
            sock.sendall(data)
        except OSError:  # the broker closed the connection while we were still sending
            return b"", True
        sock.settimeout(timeout)
        received = bytearray()
        while True:
            if len(received) >= 4 and len(received) >= 4 + struct.unpack_from(">i", received)[0]:
                return bytes(received), False
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                return bytes(received), False
            except OSError:
                return bytes(received), True
            if not chunk:
                return bytes(received), True
            received += chunk


def request(port: int, payload: bytes) -> bytes:
    """One well-formed request on a new connection; the response payload (size stripped)."""
    response, closed = exchange(port, frame(payload), timeout=HEALTH_TIMEOUT_S)
    assert len(response) >= 4, f"no response (closed={closed})"
    (size,) = struct.unpack_from(">i", response)
    assert len(response) == 4 + size, "truncated response"
    return response[4:]


def assert_serving(b: BrokerProcess) -> None:
    """The process is alive and a new connection gets good ApiVersions and Metadata answers."""
    process = b._process
    assert process is not None and process.poll() is None, f"broker died:\n{b.log_tail()}"
    try:
        payload = request(b.port, request_frame(ApiVersionsRequest[3](), correlation_id=901))
        assert struct.unpack_from(">i", payload)[0] == 901
        api_versions = ApiVersionsResponse[3].decode(payload[4:])  # header v0: correlation id
        assert api_versions.error_code == 0
        assert {k.api_key for k in api_versions.api_keys} >= {0, 1, 3, 18}

        topic = MetadataRequest.MetadataRequestTopic(name=TOPIC)
        payload = request(
            b.port, request_frame(MetadataRequest[12](topics=[topic]), correlation_id=902)
        )
        assert struct.unpack_from(">i", payload)[0] == 902
        metadata = MetadataResponse[12].decode(payload[5:])  # header v1: id + empty tag buffer
        assert [(t.name, t.error_code, len(t.partitions)) for t in metadata.topics] == [
            (TOPIC, 0, 3)
        ]
    except (AssertionError, OSError) as e:
        raise AssertionError(f"broker stopped serving: {e!r}\n{b.log_tail()}") from e


def create_fuzz_topic(b: BrokerProcess) -> None:
    payload = request(b.port, create_topics_payload(TOPIC, 3))
    assert struct.unpack_from(">i", payload)[0] == 7
    assert_serving(b)


@pytest.fixture(scope="module")
def fuzz_broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    with module_broker(tmp_path_factory, s3_server) as b:
        create_fuzz_topic(b)
        yield b


def test_valid_frames_are_answered(fuzz_broker: BrokerProcess) -> None:
    """The seeds themselves are good requests: each gets one response with its correlation id."""
    for payload in CLIENT_PAYLOADS + ADMIN_PAYLOADS:
        response, _ = exchange(fuzz_broker.port, frame(payload), timeout=HEALTH_TIMEOUT_S)
        assert len(response) >= 8, f"no response to {payload.hex()}"
        assert response[4:8] == payload[4:8], f"wrong correlation id for {payload.hex()}"
    assert_serving(fuzz_broker)


@FUZZ
@given(data=mutated_frames(CLIENT_PAYLOADS))
def test_mutated_client_requests_do_not_break_the_broker(
    fuzz_broker: BrokerProcess, data: bytes
) -> None:
    note(f"frame: {data.hex()}")
    exchange(fuzz_broker.port, data)
    assert_serving(fuzz_broker)


@settings(FUZZ, max_examples=60)
@given(data=mutated_frames(ADMIN_PAYLOADS))
def test_mutated_create_topics_do_not_break_the_broker(
    fuzz_broker: BrokerProcess, data: bytes
) -> None:
    note(f"frame: {data.hex()}")
    exchange(fuzz_broker.port, data)
    assert_serving(fuzz_broker)


@settings(FUZZ, max_examples=50)
@given(data=st.binary(max_size=256))
def test_random_bytes_do_not_break_the_broker(fuzz_broker: BrokerProcess, data: bytes) -> None:
    note(f"bytes: {data.hex()}")
    exchange(fuzz_broker.port, data)
    assert_serving(fuzz_broker)


@pytest.mark.parametrize("size", [MAX_REQUEST_BYTES + 1, 0x7FFFFFFF, -1, -(1 << 31)])
def test_bad_size_prefix_closes_the_connection(fuzz_broker: BrokerProcess, size: int) -> None:
    started = time.monotonic()
    response, closed = exchange(
        fuzz_broker.port, struct.pack(">i", size) + CLIENT_PAYLOADS[0], timeout=HEALTH_TIMEOUT_S
    )
    assert closed and response == b"", f"size {size}: connection left open"
    assert time.monotonic() - started < HEALTH_TIMEOUT_S / 2, f"size {size}: slow to close"
    assert_serving(fuzz_broker)


# CreateTopics v5, correlation id 7, client "oracle": topic "huge", 2**31 - 1 partitions.
ABSURD_PARTITIONS_FRAME = frame(create_topics_payload("huge", 0x7FFFFFFF))
INVALID_PARTITIONS, POLICY_VIOLATION = 37, 44


def test_create_topics_refuses_absurd_partition_counts(fuzz_broker: BrokerProcess) -> None:
    """Found fuzzing CreateTopics values: an absurd partition count is refused, as Kafka's
    controller refuses a CreateTopics that would write more than 10,000 records.

    A topic of 2**31 partitions, once accepted, would have Metadata build one entry per
    partition in a single event-loop step. Every client that asks for all topics (librdkafka
    does, on every refresh) would then stall the whole broker until it died of MemoryError
    (with a 2.5 GB address-space limit, after ~16 s, all connections unanswered meanwhile) or
    the OOM killer. Only the CreateTopics answer is checked here: asking
    for this topic's metadata would exhaust the test machine's memory.
    """
    response, closed = exchange(fuzz_broker.port, ABSURD_PARTITIONS_FRAME, timeout=5)
    assert not closed and len(response) >= 9, "no CreateTopics response"
    # response header v1: size, correlation id, empty tagged fields
    (topic,) = CreateTopicsResponse[5].decode(response[9:]).topics
    assert topic.error_code in (INVALID_PARTITIONS, POLICY_VIOLATION), (
        "BROKER BUG: CreateTopics accepted num_partitions=2147483647 (error_code "
        f"{topic.error_code}); a Metadata request for all topics would then block the broker "
        "and exhaust memory building 2**31 partition entries "
        "(automq_py/apis/metadata.py _topic_entry). Frame: " + ABSURD_PARTITIONS_FRAME.hex()
    )
    assert_serving(fuzz_broker)
