"""ControllerClient: how the jobs' driver reads metadata and commits through the broker.

The jobs never write the metadata database themselves: they talk to the broker's controller
over the Kafka protocol, with the extension APIs of ``protocol.extensions`` (AutoMQ's
PrepareS3Object, CommitStreamSetObject, CommitStreamObject; automq-py's DescribeS3Metadata,
ExpirePreparedObjects, DestroyS3Objects, DescribeLogSegments) and Kafka's own DeleteRecords
(kio's schemas). One connection, one request in flight at a time (calls from several tasks
queue), each answer read whole whatever its size.

On connect the client asks ApiVersions and then uses, per API, the highest version both sides
have. Errors:

* a refused metadata operation (AutoMQ's codes 501-599) raises
  ``storage.metadata.model.MetadataError`` with that code;
* any other error code raises :class:`ControllerError` (``code`` is Kafka's number);
* a connection that dies raises ``ConnectionError``; no answer within ``timeout_s`` raises
  ``TimeoutError``; an answer that cannot be decoded raises ``protocol.errors.ProtocolError``.
  After any of these the connection is closed (the request/answer pairing is lost) and later
  calls raise ``ConnectionError``: connect again.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Any, ClassVar, Self, cast

from kio.serial import entity_writer

from protocol import build, headers
from protocol import extensions as ext
from protocol.api_keys import ApiKey
from protocol.entity_reader import read_entity
from protocol.errors import ErrorCode as KafkaErrorCode
from protocol.errors import ProtocolError
from protocol.framing import SIZE
from protocol.messages import BufferCollector, request_schema, response_schema
from storage.config_def import split_list
from storage.metadata.image import (
    MetadataImage,
    offset_range_order,
    range_order,
    stream_object_order,
    stream_set_object_order,
)
from storage.metadata.model import (
    CommitRange,
    CommitStreamObject,
    ErrorCode,
    MetadataError,
    NodeMetadata,
    ObjectState,
    RangeMetadata,
    S3Object,
    StreamMetadata,
    StreamObject,
    StreamOffsetRange,
    StreamSetObject,
    StreamState,
)
from storage.metadata.records import OBJECT_ID_COUNTER
from storage.retention import PartitionLog, RetentionPolicy, SegmentInfo

log = logging.getLogger("automq.controller_client")

CLIENT_ID = "automq-py-jobs"
API_VERSIONS_VERSION = 3
DELETE_RECORDS_MAX_VERSION = 2
# a sanity bound on an answer's size prefix; DescribeS3Metadata of a large cluster stays far below
MAX_RESPONSE_BYTES = 1 << 30
NO_TIME = -1
_METADATA_CODES = frozenset(int(c) for c in ErrorCode)


FETCH_VERSION = 12  # topics by name, flexible
FETCH_MAX_BYTES = 8 << 20


@dataclass(slots=True, frozen=True)
class FetchedBatches:
    """What one Fetch of a partition returned."""

    records: bytes  # whole record batches, back to back
    aborted: tuple[tuple[int, int], ...]  # (producer id, first offset)
    high_watermark: int
    last_stable_offset: int


class ControllerError(Exception):
    """The controller answered ``api`` with an error code that is not a metadata refusal."""

    def __init__(self, api: str, code: int, detail: str = "") -> None:
        try:
            name = KafkaErrorCode(code).name
        except ValueError:
            name = "UNKNOWN"
        super().__init__(f"{api}: error {code} ({name}){': ' + detail if detail else ''}")
        self.api = api
        self.code = code


def _raise_for(api: str, code: int) -> None:
    if code == 0:
        return
    if code in _METADATA_CODES:
        raise MetadataError(ErrorCode(code), f"{api} refused")
    raise ControllerError(api, code)


@dataclass(slots=True, frozen=True)
class ClientSecurity:
    """How to reach a listener that asks for TLS or SASL: the TLS context (None: plaintext)
    and the SASL mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; None: no SASL) with the
    credentials to authenticate with."""

    ssl: ssl.SSLContext | None = None
    sasl_mechanism: str | None = None
    username: str = ""
    password: str = ""

    def __repr__(self) -> str:  # never the password
        return f"ClientSecurity(tls={self.ssl is not None}, sasl={self.sasl_mechanism})"


class ControllerClient:
    """An asyncio connection to one broker's controller APIs. Build it with :meth:`connect`."""

    # what connect() uses when it is given no security of its own
    default_security: ClassVar[ClientSecurity | None] = None

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout_s: float
    ) -> None:
        self._reader = reader
        self._writer: asyncio.StreamWriter | None = writer
        self._timeout_s = timeout_s
        self._lock = asyncio.Lock()
        self._correlation_id = 0
        self._versions: dict[int, tuple[int, int]] = {}

    @classmethod
    async def connect(
        cls, bootstrap: str, *, timeout_s: float = 30.0, security: ClientSecurity | None = None
    ) -> ControllerClient:
        """Connect to ``host:port`` (over TLS and authenticating with SASL as ``security``,
        or :attr:`default_security`, says) and learn which API versions the broker serves."""
        host, sep, port = bootstrap.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"bootstrap must be host:port, got {bootstrap!r}")
        security = security if security is not None else cls.default_security
        tls = security.ssl if security is not None else None
        name = host.strip("[]")
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(
                name, int(port), ssl=tls, server_hostname=name if tls is not None else None
            )
        client = cls(reader, writer, timeout_s)
        try:
            await client._negotiate()
            if security is not None and security.sasl_mechanism is not None:
                await client._authenticate(security)
        except BaseException:
            await client.close()
            raise
        return client

    async def _authenticate(self, security: ClientSecurity) -> None:
        """SaslHandshake, then the mechanism's tokens in SaslAuthenticate requests."""
        mechanism = str(security.sasl_mechanism)
        handshake = await self._kio_call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": mechanism})
        _raise_for("SaslHandshake", int(handshake.error_code))

        async def send(token: bytes) -> bytes:
            answer = await self._kio_call(ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": token})
            code = int(answer.error_code)
            if code != KafkaErrorCode.NONE:
                raise ControllerError("SaslAuthenticate", code, str(answer.error_message or ""))
            return bytes(answer.auth_bytes)

        if mechanism == "PLAIN":
            await send(f"\0{security.username}\0{security.password}".encode())
            return
        import scramp  # only where SCRAM is used

        scram = scramp.ScramClient([mechanism], security.username, security.password)
        server_first = await send(scram.get_client_first().encode())
        scram.set_server_first(server_first.decode())
        server_final = await send(scram.get_client_final().encode())
        scram.set_server_final(server_final.decode())

    async def close(self) -> None:
        """Close the connection (idempotent)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- metadata ------------------------------------------------------------------------------

    async def describe_s3_metadata(self) -> tuple[MetadataImage, int]:
        """The controller's streams, nodes and objects as an image, and its clock (ms)."""
        body = await self._extension(ApiKey.DESCRIBE_S3_METADATA, {})
        try:
            return _image(body), body["now_ms"]
        except ValueError as e:  # an enum value this client does not know
            raise ProtocolError(f"DescribeS3Metadata: {e}") from None

    async def prepare_objects(self, count: int, ttl_ms: int) -> int:
        """Reserve ``count`` consecutive object ids, PREPARED for ``ttl_ms``; the first id."""
        body = await self._extension(
            ApiKey.PREPARE_S3_OBJECT,
            {"node_id": -1, "prepared_count": count, "time_to_live_in_ms": ttl_ms},
        )
        first: int = body["first_s3_object_id"]
        return first

    async def commit_stream_set_object(
        self,
        node_id: int,
        node_epoch: int,
        object_id: int,
        order_id: int,
        object_size: int,
        stream_ranges: Sequence[CommitRange],
        stream_objects: Sequence[CommitStreamObject],
        compacted_object_ids: Sequence[int],
    ) -> None:
        """Commit a Stream Set Object (``object_id`` -1: Stream Objects only) for ``node_id``,
        replacing ``compacted_object_ids``; raises ``MetadataError`` when refused."""
        await self._extension(
            ApiKey.COMMIT_STREAM_SET_OBJECT,
            {
                "node_id": node_id,
                "node_epoch": node_epoch,
                "object_id": object_id,
                "order_id": order_id,
                "object_size": object_size,
                "object_stream_ranges": [
                    {
                        "stream_id": r.stream_id,
                        "stream_epoch": r.epoch,
                        "start_offset": r.start_offset,
                        "end_offset": r.end_offset,
                    }
                    for r in stream_ranges
                ],
                "stream_objects": [
                    {
                        "object_id": so.object_id,
                        "object_size": so.object_size,
                        "stream_id": so.stream_id,
                        "start_offset": so.start_offset,
                        "end_offset": so.end_offset,
                    }
                    for so in stream_objects
                ],
                "compacted_object_ids": list(compacted_object_ids),
            },
        )

    async def commit_stream_object(
        self,
        object_id: int,
        stream_id: int,
        stream_epoch: int,
        start_offset: int,
        end_offset: int,
        object_size: int,
        source_object_ids: Sequence[int],
    ) -> None:
        """Replace a stream's Stream Objects ``source_object_ids`` by ``object_id``; raises
        ``MetadataError`` when refused."""
        await self._extension(
            ApiKey.COMMIT_STREAM_OBJECT,
            {
                "node_id": -1,
                "node_epoch": -1,
                "object_id": object_id,
                "object_size": object_size,
                "stream_id": stream_id,
                "start_offset": start_offset,
                "end_offset": end_offset,
                "source_object_ids": list(source_object_ids),
                "stream_epoch": stream_epoch,
            },
        )

    async def expire_prepared_objects(self) -> list[int]:
        """Mark PREPARED objects past their deadline MARK_DESTROYED; their ids."""
        body = await self._extension(ApiKey.EXPIRE_PREPARED_OBJECTS, {})
        ids: list[int] = body["object_ids"]
        return ids

    async def destroy_objects(self, object_ids: Sequence[int]) -> None:
        """Tell the controller these MARK_DESTROYED objects are deleted from object storage."""
        await self._extension(ApiKey.DESTROY_S3_OBJECTS, {"object_ids": list(object_ids)})

    # -- partitions ----------------------------------------------------------------------------

    async def describe_log_segments(
        self, topics: Sequence[str] = (), cleanup_policy: str = ""
    ) -> tuple[list[PartitionLog], int]:
        """Every partition of ``topics`` (all topics when empty; unknown names are left out)
        with its segments and effective retention, and the controller's clock (ms). With a
        ``cleanup_policy`` (``compact``, ``delete``), only the topics whose policy has it: the
        broker does not open the others' partitions (v1; a v0 broker opens them all and they
        are dropped here). A partition the broker could not open is left out too (logged)."""
        request = {"topics": list(topics), "cleanup_policy": cleanup_policy}
        body = await self._extension(ApiKey.DESCRIBE_LOG_SEGMENTS, request)
        out = []
        for t in body["topics"]:
            policy = RetentionPolicy(
                cleanup_policy=split_list(t["cleanup_policy"]),
                retention_ms=t["retention_ms"],
                retention_bytes=t["retention_bytes"],
                delete_retention_ms=t["delete_retention_ms"],
                min_cleanable_dirty_ratio=float(t["min_cleanable_dirty_ratio"] or 0.5),
                min_compaction_lag_ms=t["min_compaction_lag_ms"],
                max_compaction_lag_ms=t["max_compaction_lag_ms"],
            )
            if cleanup_policy and cleanup_policy not in policy.cleanup_policy:
                continue  # a v0 broker does not filter
            for p in t["partitions"]:
                if p["error_code"] == KafkaErrorCode.NOT_LEADER_OR_FOLLOWER:
                    continue  # another broker of the cluster leads it, and tends it
                if p["error_code"]:
                    log.warning(
                        "%s-%d: broker answered error %d",
                        t["name"],
                        p["partition_index"],
                        p["error_code"],
                    )
                    continue
                segments = tuple(
                    SegmentInfo(
                        s["base_offset"],
                        s["next_offset"],
                        s["size_bytes"],
                        s["max_timestamp"],
                        s["cleaned"],
                        s["first_batch_timestamp"],
                    )
                    for s in p["segments"]
                )
                out.append(
                    PartitionLog(
                        t["name"],
                        p["partition_index"],
                        policy,
                        p["log_start_offset"],
                        p["log_end_offset"],
                        segments,
                        p["last_stable_offset"],
                    )
                )
        now: int = body["now_ms"]
        return out, now

    async def fetch_batches(
        self, topic: str, partition: int, offset: int, max_bytes: int = FETCH_MAX_BYTES
    ) -> FetchedBatches:
        """One read_committed Fetch of ``topic``-``partition`` from ``offset``: the raw record
        batches (up to the last stable offset), the aborted transactions among them, and the
        partition's high watermark and last stable offset. A partition error raises
        :class:`ControllerError`."""
        version = self._version(ApiKey.FETCH, FETCH_VERSION)
        body = {
            "max_wait": datetime.timedelta(0),
            "min_bytes": 0,
            "max_bytes": max_bytes,
            "isolation_level": 1,
            "topics": [
                {
                    "topic": topic,
                    "partitions": [
                        {
                            "partition": partition,
                            "fetch_offset": offset,
                            "partition_max_bytes": max_bytes,
                        }
                    ],
                }
            ],
            "rack_id": "",
        }
        response = await self._kio_call(ApiKey.FETCH, version, body)
        _raise_for("Fetch", int(response.error_code))
        (answer,) = (p for t in response.responses for p in t.partitions)
        _raise_for("Fetch", int(answer.error_code))
        aborted = tuple(
            (int(a.producer_id), int(a.first_offset)) for a in answer.aborted_transactions or ()
        )
        return FetchedBatches(
            bytes(answer.records or b""),
            aborted,
            int(answer.high_watermark),
            int(answer.last_stable_offset),
        )

    async def commit_cleaned_segment(
        self,
        topic: str,
        partition: int,
        base_offset: int,
        end_offset: int,
        batches: Sequence[tuple[int, bytes]],
        aborted: Sequence[tuple[int, int, int]] = (),
    ) -> int:
        """Replace ``topic``-``partition``'s sealed segments of ``[base_offset, end_offset)``
        with key compaction's kept batches, each ``(count, bytes)``, and the aborted
        transactions whose markers it kept, each ``(producer id, first offset, marker
        offset)``; how many segments went. A plan the log no longer fits raises
        :class:`ControllerError` (INVALID_REQUEST)."""
        body = await self._extension(
            ApiKey.COMMIT_CLEANED_SEGMENT,
            {
                "topic": topic,
                "partition_index": partition,
                "base_offset": base_offset,
                "end_offset": end_offset,
                "batches": [{"count": c, "data": d} for c, d in batches],
                "aborted_transactions": [
                    {
                        "producer_id": pid,
                        "first_offset": first,
                        "last_offset": last,
                        "last_stable_offset": -1,
                    }
                    for pid, first, last in aborted
                ],
            },
        )
        replaced: int = body["segments_replaced"]
        return replaced

    async def delete_records(
        self, offsets: Mapping[tuple[str, int], int]
    ) -> dict[tuple[str, int], tuple[int, int]]:
        """Kafka's DeleteRecords: move each (topic, partition)'s log start up to its offset
        (-1: the high watermark). (topic, partition) -> (error_code, low_watermark)."""
        version = self._version(ApiKey.DELETE_RECORDS, DELETE_RECORDS_MAX_VERSION)
        by_topic: dict[str, list[dict[str, int]]] = {}
        for (topic, partition), offset in offsets.items():
            by_topic.setdefault(topic, []).append({"partition_index": partition, "offset": offset})
        body = {
            "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()],
            "timeout": datetime.timedelta(seconds=self._timeout_s),
        }
        response = await self._kio_call(ApiKey.DELETE_RECORDS, version, body)
        return {
            (str(t.name), int(p.partition_index)): (int(p.error_code), int(p.low_watermark))
            for t in response.topics
            for p in t.partitions
        }

    # -- the wire ------------------------------------------------------------------------------

    async def call(self, api_key: int, max_version: int, body: Mapping[str, Any]) -> Any:
        """Any Kafka API, at the highest version up to ``max_version`` both sides serve: the
        decoded answer (its error codes are the caller's to read). A broker of a cluster sends
        WriteTxnMarkers to the leaders of other partitions this way."""
        return await self._kio_call(api_key, self._version(api_key, max_version), body)

    async def _negotiate(self) -> None:
        response = await self._kio_call(
            ApiKey.API_VERSIONS,
            API_VERSIONS_VERSION,
            {"client_software_name": CLIENT_ID, "client_software_version": "1"},
        )
        _raise_for("ApiVersions", int(response.error_code))
        self._versions = {
            int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys
        }

    def _version(self, api_key: int, our_max: int) -> int:
        """The highest version of ``api_key`` both sides serve."""
        theirs = self._versions.get(api_key)
        name = ext.MESSAGES[api_key].name if api_key in ext.MESSAGES else f"API {api_key}"
        if theirs is None or theirs[0] > our_max:
            raise ControllerError(
                name, KafkaErrorCode.UNSUPPORTED_VERSION, "the broker does not serve it"
            )
        return min(theirs[1], our_max)

    async def _extension(self, api_key: int, body: dict[str, Any]) -> dict[str, Any]:
        m = ext.MESSAGES[api_key]
        version = self._version(api_key, m.max_version)
        frame = await self._round_trip(
            lambda cid: ext.encode_request(api_key, version, cid, body, CLIENT_ID)
        )
        _, answer = ext.decode_response(api_key, version, frame)
        _raise_for(m.name, answer["error_code"])
        return answer

    async def _kio_call(self, api_key: int, version: int, body: Mapping[str, Any]) -> Any:
        schema = request_schema(api_key, version)
        message = build.build(schema, body)
        header_version = int(schema.__header_schema__.__version__)  # type: ignore[attr-defined]

        def encode(correlation_id: int) -> bytes:
            header = headers.RequestHeader(
                api_key, version, correlation_id, CLIENT_ID, header_version
            )
            out = BufferCollector(threshold=1 << 62)
            out.write(headers.encode_request_header(header))
            entity_writer(schema)(cast(IO[bytes], out), message)
            payload = b"".join(bytes(p) for p in out.finish())
            return SIZE.pack(len(payload)) + payload

        frame = await self._round_trip(encode)
        answer_schema = response_schema(api_key, version)
        answer_header = int(answer_schema.__header_schema__.__version__)  # type: ignore[attr-defined]
        try:
            _, pos = headers.decode_response_header(frame, answer_header)
            decoded, end = read_entity(answer_schema, memoryview(frame), pos)
        except ProtocolError:
            raise
        except Exception as e:  # kio's readers raise their own zoo of types
            raise ProtocolError(f"API {api_key} v{version}: {type(e).__name__}: {e}") from None
        if end != len(frame):
            raise ProtocolError(f"API {api_key} v{version}: {len(frame) - end} trailing bytes")
        return decoded

    async def _round_trip(self, encode: Callable[[int], bytes]) -> bytes:
        """Send one request (``encode(correlation_id)`` -> framed bytes); its answer's frame
        without the size prefix. Any failure closes the connection."""
        async with self._lock:
            writer = self._writer
            if writer is None:
                raise ConnectionError("the controller connection is closed")
            self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
            correlation_id = self._correlation_id
            data = encode(correlation_id)
            try:
                async with asyncio.timeout(self._timeout_s):
                    writer.write(data)
                    await writer.drain()
                    (size,) = SIZE.unpack(await self._reader.readexactly(SIZE.size))
                    if not 4 <= size <= MAX_RESPONSE_BYTES:
                        raise ProtocolError(f"answer size prefix {size}")
                    frame = await self._reader.readexactly(size)
            except asyncio.IncompleteReadError as e:
                await self.close()
                raise ConnectionError(
                    f"the controller closed the connection ({len(e.partial)} bytes read)"
                ) from None
            except TimeoutError:
                await self.close()
                raise TimeoutError(f"no answer within {self._timeout_s} s") from None
            except BaseException:
                await self.close()
                raise
            (answered,) = SIZE.unpack_from(frame)
            if answered != correlation_id:
                await self.close()
                raise ProtocolError(f"answer to request {answered}, expected {correlation_id}")
            return frame


def _image(body: Mapping[str, Any]) -> MetadataImage:
    """The image a DescribeS3Metadata answer describes (KV pairs are not part of it)."""
    streams: dict[int, StreamMetadata] = {}
    for s in body["streams"]:
        sid = s["stream_id"]
        ranges = sorted(
            (
                RangeMetadata(
                    sid,
                    r["epoch"],
                    r["range_index"],
                    r["start_offset"],
                    r["end_offset"],
                    r["node_id"],
                )
                for r in s["ranges"]
            ),
            key=range_order,
        )
        sos = sorted(
            (
                StreamObject(
                    so["object_id"], sid, so["start_offset"], so["end_offset"], so["object_size"]
                )
                for so in s["stream_objects"]
            ),
            key=stream_object_order,
        )
        streams[sid] = StreamMetadata(
            sid,
            s["epoch"],
            StreamState(s["state"]),
            s["start_offset"],
            s["end_offset"],
            tuple(ranges),
            tuple(sos),
        )
    nodes: dict[int, NodeMetadata] = {}
    for n in body["nodes"]:
        nid = n["node_id"]
        ssos = sorted(
            (
                StreamSetObject(
                    o["object_id"],
                    nid,
                    o["order_id"],
                    o["data_time_ms"],
                    o["object_size"],
                    tuple(
                        sorted(
                            (
                                StreamOffsetRange(
                                    r["stream_id"], r["start_offset"], r["end_offset"]
                                )
                                for r in o["ranges"]
                            ),
                            key=offset_range_order,
                        )
                    ),
                )
                for o in n["stream_set_objects"]
            ),
            key=stream_set_object_order,
        )
        nodes[nid] = NodeMetadata(nid, n["node_epoch"], n["failover"], tuple(ssos))
    objects = {
        o["object_id"]: S3Object(
            o["object_id"],
            ObjectState(o["state"]),
            o["object_size"],
            o["prepared_ms"],
            o["expires_ms"],
            None if o["committed_ms"] == NO_TIME else o["committed_ms"],
            None if o["mark_destroyed_ms"] == NO_TIME else o["mark_destroyed_ms"],
        )
        for o in body["objects"]
    }
    return MetadataImage(
        streams=streams,
        nodes=nodes,
        objects=objects,
        counters={OBJECT_ID_COUNTER: body["next_object_id"]},
    )
