"""Fuzzing: random and mutated input yields only the codec's own errors, never a hang.

A decoder that leaks ``IndexError``/``struct.error`` (or worse, aborts the process,
as kio's native reader does on a huge array count) lets one client take down the
broker; these properties pin that down.
"""

from __future__ import annotations

import contextlib
import struct
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.admin import CreateTopicsRequest, UpdateFeaturesRequest
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest

from protocol import messages, record_batch
from protocol.errors import ProtocolError
from protocol.framing import FrameDecoder
from protocol.records import Compression, RecordInput, build_batch, parse_records
from tests.protocol.kafka_oracle import request_frame

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

BATCH = bytes(build_batch([RecordInput(b"value", b"key", [("h", b"v")], 1_700_000_000_000)] * 3))
BATCHES = {
    codec: bytes(
        build_batch([RecordInput(b"v" * 50, b"k", [], 1_700_000_000_000)] * 4, compression=codec)
    )
    for codec in Compression
}


def _valid_frames() -> list[bytes]:
    topic = ProduceRequest.TopicProduceData
    produce = [
        request_frame(
            ProduceRequest[v](
                acks=1,
                timeout_ms=100,
                topic_data=[
                    topic(
                        name="t",
                        topic_id=uuid.UUID(int=1),
                        partition_data=[topic.PartitionProduceData(index=0, records=BATCH)],
                    )
                ],
            )
        )
        for v in (3, 8, 9, 11)
    ]
    fetch_partition = FetchRequest.FetchTopic.FetchPartition(
        partition=0, fetch_offset=5, partition_max_bytes=100
    )
    fetch = [
        request_frame(
            FetchRequest[v](
                max_wait_ms=1,
                min_bytes=1,
                topics=[FetchRequest.FetchTopic(topic="t", partitions=[fetch_partition])],
                forgotten_topics_data=[],
                cluster_id="c",
            )
        )
        for v in (4, 12, 17)
    ]
    # as consumers send them, without tagged fields: read by protocol.fetch's own decoder
    fetch += [
        request_frame(
            FetchRequest[v](
                max_wait_ms=500,
                min_bytes=1,
                topics=[
                    FetchRequest.FetchTopic(
                        topic="t",
                        topic_id=uuid.UUID(int=2),
                        partitions=[fetch_partition, fetch_partition],
                    )
                ],
                forgotten_topics_data=[
                    FetchRequest.ForgottenTopic(
                        topic="g", topic_id=uuid.UUID(int=3), partitions=[1, 2]
                    )
                ],
                rack_id="r",
            )
        )
        for v in (4, 7, 11, 13, 15, 17)
    ]
    other = [
        request_frame(ApiVersionsRequest[3](client_software_name="a", client_software_version="b")),
        *(
            request_frame(
                UpdateFeaturesRequest[v](
                    timeout_ms=1,
                    feature_updates=[
                        UpdateFeaturesRequest.FeatureUpdateKey(
                            feature="f", max_version_level=1, allow_downgrade=True, upgrade_type=2
                        )
                    ],
                    validate_only=True,
                )
            )
            for v in (0, 1)
        ),
        request_frame(MetadataRequest[12](topics=[MetadataRequest.MetadataRequestTopic(name="x")])),
        request_frame(MetadataRequest[1](topics=None)),
        request_frame(
            CreateTopicsRequest[5](
                topics=[
                    CreateTopicsRequest.CreatableTopic(
                        name="n", num_partitions=1, replication_factor=1, assignments=[], configs=[]
                    )
                ],
                timeout_ms=1,
            )
        ),
    ]
    return produce + fetch + other


FRAMES = _valid_frames()


def _decode(frame: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        messages.decode_request(frame)


@st.composite
def mutated(draw: st.DrawFn, originals: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(originals)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "int32", "int16", "byte", "insert"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "int32" and pos + 4 <= len(data):
            value = draw(st.sampled_from([-2, -1, 0, 1, 0x7FFFFFFF, -(1 << 31), 1 << 20]))
            struct.pack_into(">i", data, pos, value)
        elif kind == "int16" and pos + 2 <= len(data):
            struct.pack_into(">h", data, pos, draw(st.sampled_from([-2, -1, 0, 0x7FFF])))
        elif kind == "byte" and data:
            data[pos] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF]))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes_decode(data: bytes) -> None:
    _decode(data)


@FUZZ
@given(st.integers(0, 40), st.binary(max_size=200))
def test_random_bytes_behind_a_valid_header(which: int, tail: bytes) -> None:
    frame = FRAMES[which % len(FRAMES)]
    _decode(frame[:12] + tail)


@FUZZ
@given(mutated(FRAMES))
def test_mutated_requests(data: bytes) -> None:
    _decode(data)


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=8), st.integers(1, 1 << 20))
def test_frame_decoder_random_chunks(chunks: list[bytes], max_size: int) -> None:
    decoder = FrameDecoder(max_frame_size=max_size)
    try:
        for chunk in chunks:
            for frame in decoder.feed(chunk):
                assert len(frame) <= max_size
    except ProtocolError:
        pass


@FUZZ
@given(mutated(list(BATCHES.values())))
def test_mutated_record_batches(data: bytes) -> None:
    try:
        for _header, view in record_batch.iter_batches(data):
            record_batch.validate_batch(view, from_producer=False)
            parse_records(view, check_crc=False)
    except ProtocolError:
        pass


@FUZZ
@given(mutated(list(BATCHES.values())))
def test_mutated_batches_without_crc_check(data: bytes) -> None:
    # Parsing past a (deliberately skipped) CRC check must still fail cleanly.
    try:
        header = record_batch.parse_header(data)
        parse_records(memoryview(data)[: header.size], check_crc=False)
    except ProtocolError:
        pass
