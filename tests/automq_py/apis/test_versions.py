"""The versions served come from one table: KafkaApis.supported gates decoding and is what
ApiVersions advertises; every codec covers the versions listed, the hand-written ones exactly;
a version above the table is refused as Kafka refuses it (the KIP-511 answer for ApiVersions,
a closed connection for the rest)."""

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
