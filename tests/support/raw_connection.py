"""A blocking Kafka connection for tests that speak the protocol by hand (kafka-python's
request and response classes): one request at a time (``call``), or pipelined (``send`` many,
then ``receive`` their responses in order)."""

from __future__ import annotations

import socket
import struct
import uuid
from typing import Any

from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.producer import ProduceRequest

from tests.protocol.kafka_oracle import request_frame


def fetch_request(
    topic: str | uuid.UUID,
    offsets: dict[int, int],
    *,
    max_wait_ms: int = 100,
    min_bytes: int = 1,
    max_bytes: int = 1 << 24,
    partition_max_bytes: int = 1 << 22,
    version: int = 4,
) -> Any:
    """A Fetch of ``topic``'s partitions (by its id from v13) from their offsets (partition ->
    offset); v4 unless ``version`` says otherwise (from v7 without a fetch session)."""
    t = FetchRequest.FetchTopic
    session = {"session_id": 0, "session_epoch": -1} if version >= 7 else {}
    named = {"topic_id": topic} if isinstance(topic, uuid.UUID) else {"topic": topic}
    return FetchRequest[version](
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=0,
        **session,
        topics=[
            t(
                **named,
                partitions=[
                    t.FetchPartition(
                        partition=p, fetch_offset=o, partition_max_bytes=partition_max_bytes
                    )
                    for p, o in offsets.items()
                ],
            )
        ],
    )


def partition_produce_request(
    topic: str,
    partition: int,
    records: bytes,
    *,
    version: int = 9,
    acks: int = -1,
    timeout_ms: int = 30000,
    transactional_id: str | None = None,
) -> Any:
    """A Produce request of one partition's batch: librdkafka's shape."""
    data = ProduceRequest.TopicProduceData
    return ProduceRequest[version](
        transactional_id=transactional_id,
        acks=acks,
        timeout_ms=timeout_ms,
        topic_data=[
            data(name=topic, partition_data=[data.PartitionProduceData(partition, records)])
        ],
    )


class RawConnection:
    """A blocking Kafka connection sending kafka-python requests and decoding the answers."""

    def __init__(self, bootstrap: str, client_id: str = "oracle") -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=15)
        self.correlation_id = 0
        self.client_id = client_id

    def call(self, request: Any, response_class: Any) -> Any:
        self.correlation_id += 1
        frame = request_frame(request, self.correlation_id, self.client_id)
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        (size,) = struct.unpack(">i", self._read(4))
        return response_class.decode(self._read(size), version=request.API_VERSION, header=True)

    def frame(self, request: Any) -> tuple[int, bytes]:
        """The next correlation id and the size-prefixed frame of ``request`` (to send later,
        possibly together with others)."""
        self.correlation_id += 1
        frame = request_frame(request, self.correlation_id, self.client_id)
        return self.correlation_id, struct.pack(">i", len(frame)) + frame

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_together(self, requests: list[Any]) -> list[int]:
        """Send ``requests`` in one write (the broker reads them together, as a client's
        burst); their correlation ids, in order."""
        ids, data = [], bytearray()
        for request in requests:
            correlation_id, frame = self.frame(request)
            ids.append(correlation_id)
            data += frame
        self.send(bytes(data))
        return ids

    def receive(self, request: Any, response_class: Any) -> tuple[int, Any]:
        """The next response on the wire, decoded as the answer to ``request``: its
        correlation id and body."""
        (size,) = struct.unpack(">i", self._read(4))
        raw = self._read(size)
        (correlation_id,) = struct.unpack_from(">i", raw)
        return correlation_id, response_class.decode(raw, version=request.API_VERSION, header=True)

    def _read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            out += chunk
        return out

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
