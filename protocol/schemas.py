"""Message schemas by API key and version: kio's, and the few Kafka 3.9 versions kio lacks.

kio is generated from Kafka 4's message definitions, which dropped the versions KIP-896
removed; Kafka 3.9 still serves them. Those the broker serves are given here as kio schema
classes, so every reader, writer and builder takes them as it takes kio's:

=====================  =======  ===========================================================
API                    version  schema
=====================  =======  ===========================================================
WriteTxnMarkers (27)   0        v1's fields, not flexible (Kafka's JSON: "Version 1 enables
                                flexible versions"): request header v1, response header v0
AlterReplicaLogDirs    0        kio's v1 classes, as DescribeLogDirs v0 (the same JSON
(34)                            comment)
DescribeLogDirs (35)   0        kio's v1 classes: the same bytes ("Version 1 is the same as
                                version 0"; v1's response only answers before throttling)
=====================  =======  ===========================================================

No ``from __future__ import annotations`` here: kio reads the field types of these classes, and
must find classes, not strings.
"""

from dataclasses import dataclass, field
from typing import ClassVar

from kio.index import KioIndexError
from kio.index import load_request_schema as kio_request_schema
from kio.index import load_response_schema as kio_response_schema
from kio.schema.alter_replica_log_dirs.v1.request import AlterReplicaLogDirsRequest
from kio.schema.alter_replica_log_dirs.v1.response import AlterReplicaLogDirsResponse
from kio.schema.describe_log_dirs.v1.request import DescribeLogDirsRequest
from kio.schema.describe_log_dirs.v1.response import DescribeLogDirsResponse
from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.response_header.v0.header import ResponseHeader
from kio.schema.types import ProducerId, TopicName
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32
from kio.static.protocol import RequestPayload, ResponsePayload

from protocol.api_keys import ApiKey

# -- WriteTxnMarkers v0 (kio's v1 classes, not flexible) ------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class WritableTxnMarkerTopic:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(ApiKey.WRITE_TXN_MARKERS)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    name: TopicName = field(metadata={"kafka_type": "string"})
    """The topic name."""
    partition_indexes: tuple[i32, ...] = field(metadata={"kafka_type": "int32"}, default=())
    """The indexes of the partitions to write transaction markers for."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WritableTxnMarker:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(ApiKey.WRITE_TXN_MARKERS)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    producer_id: ProducerId = field(metadata={"kafka_type": "int64"})
    """The current producer ID."""
    producer_epoch: i16 = field(metadata={"kafka_type": "int16"})
    """The current epoch associated with the producer ID."""
    transaction_result: bool = field(metadata={"kafka_type": "bool"})
    """The result of the transaction to write to the partitions (false = ABORT, true = COMMIT)."""
    topics: tuple[WritableTxnMarkerTopic, ...]
    """Each topic that we want to write transaction marker(s) for."""
    coordinator_epoch: i32 = field(metadata={"kafka_type": "int32"})
    """Epoch associated with the transaction state partition hosted by this coordinator."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteTxnMarkersRequest:
    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(ApiKey.WRITE_TXN_MARKERS)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    markers: tuple[WritableTxnMarker, ...]
    """The transaction markers to be written."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WritableTxnMarkerPartitionResult:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(ApiKey.WRITE_TXN_MARKERS)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    """The partition index."""
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    """The error code, or 0 if there was no error."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WritableTxnMarkerTopicResult:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(ApiKey.WRITE_TXN_MARKERS)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    name: TopicName = field(metadata={"kafka_type": "string"})
    """The topic name."""
    partitions: tuple[WritableTxnMarkerPartitionResult, ...]
    """The results by partition."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WritableTxnMarkerResult:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(ApiKey.WRITE_TXN_MARKERS)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    producer_id: ProducerId = field(metadata={"kafka_type": "int64"})
    """The current producer ID in use by the transactional ID."""
    topics: tuple[WritableTxnMarkerTopicResult, ...]
    """The results by topic."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteTxnMarkersResponse:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(ApiKey.WRITE_TXN_MARKERS)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    markers: tuple[WritableTxnMarkerResult, ...]
    """The results for writing markers."""


# (api_key, version) -> (request schema, response schema), for versions kio does not have
REMOVED_VERSIONS: dict[tuple[int, int], tuple[type[RequestPayload], type[ResponsePayload]]] = {
    (ApiKey.WRITE_TXN_MARKERS, 0): (WriteTxnMarkersRequest, WriteTxnMarkersResponse),
    (ApiKey.ALTER_REPLICA_LOG_DIRS, 0): (AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse),
    (ApiKey.DESCRIBE_LOG_DIRS, 0): (DescribeLogDirsRequest, DescribeLogDirsResponse),
}


def load_request_schema(api_key: int, api_version: int) -> type[RequestPayload]:
    """The request schema class of this API version (raises kio's ``KioIndexError``)."""
    try:
        return kio_request_schema(api_key, api_version)
    except KioIndexError:
        if (api_key, api_version) in REMOVED_VERSIONS:
            return REMOVED_VERSIONS[api_key, api_version][0]
        raise


def load_response_schema(api_key: int, api_version: int) -> type[ResponsePayload]:
    """The response schema class of this API version (raises kio's ``KioIndexError``)."""
    try:
        return kio_response_schema(api_key, api_version)
    except KioIndexError:
        if (api_key, api_version) in REMOVED_VERSIONS:
            return REMOVED_VERSIONS[api_key, api_version][1]
        raise
