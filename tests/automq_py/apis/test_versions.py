"""The versions served come from one table: KafkaApis.supported gates decoding and is what
ApiVersions advertises; every codec covers the versions listed, the hand-written ones exactly;
a version above the table is refused as Kafka refuses it (the KIP-511 answer for ApiVersions,
a closed connection for the rest). The table is Kafka 3.9's for every Kafka API served, but for
the exceptions listed with their reasons."""

from __future__ import annotations

import asyncio
import struct
from typing import IO, Any, cast

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kio.index import KioIndexError, load_request_schema
from kio.serial import entity_writer

from automq_py import apis as apis_package
from automq_py.apis import KafkaApis
from automq_py.network.server import SocketServer
from protocol import build, extensions, fetch, headers, messages, produce, schemas
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode, UnsupportedVersionError
from protocol.framing import SIZE
from protocol.messages import BufferCollector, request_schema, response_schema
from tests.protocol.kafka_oracle import request_frame


def supported() -> dict[int, tuple[int, int]]:
    return KafkaApis(ctx=None).supported  # type: ignore[arg-type]  # no handler runs


SUPPORTED = supported()


def request_at(api_key: int, version: int, correlation_id: int = 3) -> bytes:
    """A well-formed request (every field at its default) of ``api_key`` v``version``."""
    if extensions.serves(api_key, version):
        return extensions.encode_request(api_key, version, correlation_id, {})[SIZE.size :]
    schema = request_schema(api_key, version)
    header_version = int(schema.__header_schema__.__version__)  # type: ignore[attr-defined]
    header = headers.RequestHeader(api_key, version, correlation_id, "test", header_version)
    out = BufferCollector()
    out.write(headers.encode_request_header(header))
    entity_writer(schema)(cast(IO[bytes], out), build.build(schema, {}))
    return b"".join(bytes(p) for p in out.finish())


def test_the_table_is_the_handler_modules_tables_and_api_versions() -> None:
    listed: dict[int, tuple[int, int]] = {}
    for module in apis_package.MODULES:
        for key, (_, lo, hi) in module.HANDLERS.items():
            assert key not in listed, f"{ApiKey(key).name} is listed twice"
            listed[key] = (lo, hi)
    assert {**listed, ApiKey.API_VERSIONS: SUPPORTED[ApiKey.API_VERSIONS]} == SUPPORTED
    assert all(isinstance(key, ApiKey) for key in SUPPORTED)


# What a single Apache Kafka 3.9.0 broker (KRaft, default configuration, no unstable versions)
# advertises in ApiVersions: api key -> (min, max). Sources: apache/kafka's
# clients/src/main/resources/common/message/*Request.json ("validVersions", "listeners"
# including "broker", "latestVersionUnstable" versions left out), with the KIP of each version
# for the release it came in, cross-checked against franz-go's pkg/kversion (b39, the 3.9 KRaft
# broker's ApiVersions). Every minimum is 0: the versions KIP-896 removed went in Kafka 4.0.
# Not listed: telemetry (71, 72), advertised only with a client telemetry reporter configured.
KAFKA_3_9: dict[int, tuple[int, int]] = {
    0: (0, 11),  # Produce (v12: KIP-890 part 2, 4.0)
    1: (0, 17),  # Fetch
    2: (0, 9),  # ListOffsets (v9: KIP-1005, 3.9; v10: KIP-1075, 4.0)
    3: (0, 12),  # Metadata (v13: KIP-1102, 4.0)
    8: (0, 9),  # OffsetCommit
    9: (0, 9),  # OffsetFetch
    10: (0, 6),  # FindCoordinator
    11: (0, 9),  # JoinGroup
    12: (0, 4),  # Heartbeat
    13: (0, 5),  # LeaveGroup
    14: (0, 5),  # SyncGroup
    15: (0, 5),  # DescribeGroups (v6: KIP-1043, 4.0)
    16: (0, 5),  # ListGroups
    17: (0, 1),  # SaslHandshake
    18: (0, 4),  # ApiVersions
    19: (0, 7),  # CreateTopics
    20: (0, 6),  # DeleteTopics
    21: (0, 2),  # DeleteRecords
    22: (0, 5),  # InitProducerId
    23: (0, 4),  # OffsetForLeaderEpoch
    24: (0, 5),  # AddPartitionsToTxn (v5: TRANSACTION_ABORTABLE, KAFKA-16314, 3.8)
    25: (0, 4),  # AddOffsetsToTxn
    26: (0, 4),  # EndTxn (v5: KIP-890 part 2, 4.0)
    27: (0, 1),  # WriteTxnMarkers
    28: (0, 4),  # TxnOffsetCommit (v5: KIP-890 part 2, 4.0)
    29: (0, 3),  # DescribeAcls
    30: (0, 3),  # CreateAcls
    31: (0, 3),  # DeleteAcls
    32: (0, 4),  # DescribeConfigs
    33: (0, 2),  # AlterConfigs
    34: (0, 2),  # AlterReplicaLogDirs
    35: (0, 4),  # DescribeLogDirs
    36: (0, 2),  # SaslAuthenticate
    37: (0, 3),  # CreatePartitions
    38: (0, 3),  # CreateDelegationToken
    39: (0, 2),  # RenewDelegationToken
    40: (0, 2),  # ExpireDelegationToken
    41: (0, 3),  # DescribeDelegationToken
    42: (0, 2),  # DeleteGroups
    43: (0, 2),  # ElectLeaders
    44: (0, 1),  # IncrementalAlterConfigs
    45: (0, 0),  # AlterPartitionReassignments
    46: (0, 0),  # ListPartitionReassignments
    47: (0, 0),  # OffsetDelete
    48: (0, 1),  # DescribeClientQuotas
    49: (0, 1),  # AlterClientQuotas
    50: (0, 0),  # DescribeUserScramCredentials
    51: (0, 0),  # AlterUserScramCredentials
    55: (0, 2),  # DescribeQuorum
    57: (0, 1),  # UpdateFeatures
    60: (0, 1),  # DescribeCluster (v2: 4.0)
    61: (0, 0),  # DescribeProducers
    64: (0, 0),  # UnregisterBroker
    65: (0, 0),  # DescribeTransactions
    66: (0, 1),  # ListTransactions (v2: KIP-1152, 4.1)
    68: (0, 0),  # ConsumerGroupHeartbeat (v1: regex subscriptions, KIP-848 GA, 4.0)
    69: (0, 0),  # ConsumerGroupDescribe (v1: KIP-1099, 4.0)
    74: (0, 0),  # ListClientMetricsResources
    75: (0, 0),  # DescribeTopicPartitions
    80: (0, 0),  # AddRaftVoter
    81: (0, 0),  # RemoveRaftVoter
}

# Where this broker's minimum is above Kafka 3.9's, and why.
MIN_EXCEPTIONS: dict[int, int] = {
    # magic v0/v1 message sets are not stored (Kafka 4.0 dropped these versions too, KIP-896)
    ApiKey.PRODUCE: 3,
    ApiKey.FETCH: 4,
    # versions KIP-896 removed in Kafka 4.0, so kio (generated from Kafka 4) has no schema
    ApiKey.LIST_OFFSETS: 1,
    ApiKey.OFFSET_COMMIT: 2,  # Kafka 3.9's KRaft broker answers v0 with an error (ZooKeeper)
    ApiKey.OFFSET_FETCH: 1,  # the same for v0
    ApiKey.CREATE_TOPICS: 2,
    ApiKey.DELETE_TOPICS: 1,
    ApiKey.DESCRIBE_CONFIGS: 1,
    ApiKey.DESCRIBE_ACLS: 1,
    ApiKey.CREATE_ACLS: 1,
    ApiKey.DELETE_ACLS: 1,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: 2,
}
# Where this broker's maximum is not Kafka 3.9's, and why.
MAX_EXCEPTIONS: dict[int, int] = {
    # librdkafka's group.protocol=consumer needs v1 (Kafka 4.0's); against v0 its consumer says
    # "ConsumerGroupHeartbeatRequest not supported by broker" and never joins
    ApiKey.CONSUMER_GROUP_HEARTBEAT: 1,
    # KIP-1099 (Kafka 4.0): each member's type, classic or consumer, in a group moving between
    # the protocols
    ApiKey.CONSUMER_GROUP_DESCRIBE: 1,
    # KIP-1073 (Kafka 4.0): fenced brokers too, for Admin.describeCluster and kafka-cluster's
    # list-endpoints --include-fenced-brokers
    ApiKey.DESCRIBE_CLUSTER: 2,
}


def test_kafka_apis_have_kafka_3_9s_versions() -> None:
    served = {key: SUPPORTED[key] for key in SUPPORTED if key not in extensions.MESSAGES}
    assert served.keys() <= KAFKA_3_9.keys(), "an API a Kafka 3.9 broker does not serve"
    assert MIN_EXCEPTIONS.keys() <= served.keys() and MAX_EXCEPTIONS.keys() <= served.keys()
    for key, (lo, hi) in sorted(served.items()):
        kafka_lo, kafka_hi = KAFKA_3_9[key]
        name = ApiKey(key).name
        assert hi == MAX_EXCEPTIONS.get(key, kafka_hi), f"{name}: max {hi}, Kafka 3.9 {kafka_hi}"
        assert lo >= kafka_lo, f"{name}: min {lo}, below Kafka 3.9's {kafka_lo}"
        assert lo == MIN_EXCEPTIONS.get(key, kafka_lo), f"{name}: min {lo}, Kafka 3.9 {kafka_lo}"
    for key, hi in MAX_EXCEPTIONS.items():
        assert hi != KAFKA_3_9[key][1], f"{ApiKey(key).name} is no exception"
    for key, lo in MIN_EXCEPTIONS.items():
        assert lo != KAFKA_3_9[key][0], f"{ApiKey(key).name} is no exception"


def test_hand_written_codecs_cover_exactly_the_advertised_versions() -> None:
    assert SUPPORTED[ApiKey.PRODUCE] == (produce.MIN_VERSION, produce.MAX_VERSION)
    assert SUPPORTED[ApiKey.FETCH] == (fetch.MIN_VERSION, fetch.MAX_VERSION)
    for key, message in extensions.MESSAGES.items():
        assert SUPPORTED[key] == (message.min_version, message.max_version)
    # the schemas written for versions kio lacks are advertised, and kio still lacks them
    for key, version in schemas.REMOVED_VERSIONS:
        lo, hi = SUPPORTED[key]
        assert lo <= version <= hi, f"{ApiKey(key).name} v{version} is not served"
        with pytest.raises(KioIndexError):
            load_request_schema(key, version)


@pytest.mark.parametrize("api_key", sorted(SUPPORTED), ids=lambda key: ApiKey(key).name)
def test_every_advertised_version_decodes_and_the_next_is_refused(api_key: int) -> None:
    lo, hi = SUPPORTED[api_key]
    for version in range(lo, hi + 1):
        request = messages.decode_request(request_at(api_key, version), SUPPORTED)
        assert (request.api_key, request.api_version) == (api_key, version)
        if not extensions.serves(api_key, version):
            response_schema(api_key, version)  # kio can encode the answer
    for version in (lo - 1, hi + 1):
        frame = struct.pack(">hhih", api_key, version, 9, -1) + b"\x00"
        with pytest.raises(UnsupportedVersionError) as info:
            messages.decode_request(frame, SUPPORTED)
        assert info.value.correlation_id == 9


async def test_api_versions_advertises_the_table() -> None:
    apis = KafkaApis(ctx=None)  # type: ignore[arg-type]  # ApiVersions does not use it
    message = ApiVersionsRequest[3](client_software_name="t", client_software_version="1")
    request = messages.decode_request(request_frame(message), apis.supported)
    buffers = await apis.handle(request)
    assert buffers is not None
    data = b"".join(bytes(b) for b in buffers)
    response: Any = ApiVersionsResponse.decode(data[4:], version=3, header=True)
    assert response.error_code == ErrorCode.NONE
    advertised = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert advertised == SUPPORTED


async def exchange(port: int, frame: bytes) -> bytes | None:
    """Send one frame; the answer's frame (size prefix stripped), or None if the server
    closed the connection without one."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(SIZE.pack(len(frame)) + frame)
        await writer.drain()
        prefix = await asyncio.wait_for(reader.read(SIZE.size), 10)
        if not prefix:
            return None
        (size,) = SIZE.unpack(prefix + await reader.readexactly(SIZE.size - len(prefix)))
        return await asyncio.wait_for(reader.readexactly(size), 10)
    finally:
        writer.close()


async def test_a_version_above_the_table_is_refused_as_kafka_does() -> None:
    server = SocketServer(
        KafkaApis(ctx=None),  # type: ignore[arg-type]  # refused before any handler runs
        max_request_size=1 << 20,
        idle_timeout_s=30,
    )
    await server.start("127.0.0.1", 0)
    try:
        for api_key, (_, hi) in SUPPORTED.items():
            frame = struct.pack(">hhih", api_key, hi + 1, 77, -1) + b"\x00"
            answer = await exchange(server.port, frame)
            if api_key != ApiKey.API_VERSIONS:
                assert answer is None, f"{ApiKey(api_key).name} v{hi + 1} was answered"
                continue
            # KIP-511: a v0 answer with UNSUPPORTED_VERSION and the table
            assert answer is not None
            response: Any = ApiVersionsResponse.decode(answer, version=0, header=True)
            assert response.header.correlation_id == 77
            assert response.error_code == ErrorCode.UNSUPPORTED_VERSION
            advertised = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
            assert advertised == SUPPORTED
    finally:
        await server.stop()


@pytest.mark.integration
def test_kafka_python_infers_a_kafka_39_broker(broker: Any) -> None:
    """Clients read the broker's version off its ApiVersions: kafka-python's inference, against
    the real broker, names 3.9."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        assert admin._client.check_version() == (3, 9)
    finally:
        admin.close()
