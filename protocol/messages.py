"""Requests in, responses out: header + body codec over kio's schemas.

A request frame (size prefix already stripped by ``FrameDecoder``):

==========  ======================================================================
part        contents
==========  ======================================================================
header      request header v1 or v2 (``headers``), chosen by api_key/api_version
body        the API's request message (kio schema ``kio.schema.<api>.v<N>.request``, or
            ``schemas``' for the few Kafka 3.9 versions kio lacks)
==========  ======================================================================

A response is ``[size prefix, response header v0/v1, body buffers...]``.

Decoding paths:

* Produce (``produce.MIN_VERSION``-``MAX_VERSION``) is parsed by
  ``produce.decode_produce_request`` so that record bytes stay views into the frame; its body
  is a ``ProduceRequestData``.
* The controller's extension APIs (AutoMQ's 5xx/6xx keys and automq-py's 1000+), which kio
  does not have, use request header v2 and are read by ``extensions``; their body is a dict.
* Every other API is read by ``entity_reader.read_entity`` from kio's schema classes
  (kio's native whole-entity reader is unsafe on untrusted input: see that module).

Which versions are accepted is the ``supported`` table given to ``decode_request``: the broker
passes the one it advertises in ApiVersions, so a request is decoded exactly when its version
was advertised.

Every failure comes out as ``UnsupportedVersionError`` or ``InvalidRequestError``
(with the correlation id once the first 8 bytes were read).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any, cast

from kio.index import KioIndexError
from kio.serial import entity_writer
from kio.static.protocol import Entity

from protocol import extensions, fetch, headers, produce, wire
from protocol.api_keys import ApiKey
from protocol.entity_reader import read_entity
from protocol.errors import InvalidRequestError, ProtocolError, UnsupportedVersionError
from protocol.framing import SIZE
from protocol.headers import RequestHeader, ResponseHeaderInfo
from protocol.schemas import load_request_schema, load_response_schema

SupportedVersions = Mapping[int, tuple[int, int]]
"""api_key -> (min_version, max_version), inclusive."""


@dataclass(slots=True, frozen=True)
class Request:
    """A decoded request: its header and body.

    ``body`` is a kio request payload (``kio.schema.<api>.v<N>.request.<Name>Request``),
    for Produce a ``produce.ProduceRequestData``, for an extension API a dict (``extensions``).
    """

    header: RequestHeader
    body: Any

    @property
    def api_key(self) -> int:
        """The request's API key."""
        return self.header.api_key

    @property
    def api_version(self) -> int:
        """The request's API version."""
        return self.header.api_version

    @property
    def correlation_id(self) -> int:
        """The correlation id to echo in the response."""
        return self.header.correlation_id

    @property
    def response_info(self) -> ResponseHeaderInfo:
        """What ``encode_response`` needs to answer this request."""
        return ResponseHeaderInfo.of(self.header)


def decode_request(frame: wire.Buffer, supported: SupportedVersions | None = None) -> Request:
    """Decode one request frame (size prefix stripped).

    ``supported`` limits the accepted API keys/versions (the broker's table: the versions it
    advertises in ApiVersions); without it, everything kio or ``extensions`` has a schema for
    is accepted (Produce: what ``produce`` decodes).
    """
    api_key, api_version, correlation_id = headers.peek_request_ids(frame)
    if supported is not None:
        bounds = supported.get(api_key)
        if bounds is None or not bounds[0] <= api_version <= bounds[1]:
            raise UnsupportedVersionError(api_key, api_version, correlation_id)
    # the hottest requests, Produce and Fetch: their header version without the lookups below
    if api_key == ApiKey.PRODUCE and produce.MIN_VERSION <= api_version <= produce.MAX_VERSION:
        header_version: int | None = 2 if api_version >= produce.FIRST_FLEXIBLE_VERSION else 1
    elif api_key == ApiKey.FETCH and fetch.MIN_VERSION <= api_version <= fetch.MAX_VERSION:
        header_version = 2 if api_version >= fetch.FIRST_FLEXIBLE_VERSION else 1
    elif extensions.serves(api_key, api_version):
        header_version = extensions.REQUEST_HEADER_VERSION
    else:
        header_version = headers.request_header_version(api_key, api_version)
    if header_version is None or (
        api_key == ApiKey.PRODUCE and not produce.MIN_VERSION <= api_version <= produce.MAX_VERSION
    ):
        raise UnsupportedVersionError(api_key, api_version, correlation_id)
    view = memoryview(frame)
    if not view.readonly and api_key != ApiKey.PRODUCE:
        # kio refuses writable buffers. A writable Produce frame is the request's own memory
        # (the server reads large frames into buffers of their own): its record batches are
        # views of it that the broker may edit in place (offsets), not copies.
        view = memoryview(bytes(view))
    header, pos = headers.decode_request_header(
        view, header_version, (api_key, api_version, correlation_id)
    )
    try:
        body = _decode_body(view, pos, api_key, api_version)
    except ProtocolError as e:
        raise InvalidRequestError(
            f"api_key {api_key} v{api_version}: {e}", correlation_id
        ) from None
    except Exception as e:
        # kio's native reader raises a zoo of types (DecodeError, ValueError,
        # OverflowError, UnicodeDecodeError, ...); the caller must only see ours.
        raise InvalidRequestError(
            f"api_key {api_key} v{api_version}: {type(e).__name__}: {e}", correlation_id
        ) from None
    return Request(header, body)


def _decode_body(view: memoryview, pos: int, api_key: int, api_version: int) -> Any:
    if api_key == ApiKey.PRODUCE:
        return produce.decode_produce_request(view, pos, api_version)
    if api_key == ApiKey.FETCH and fetch.MIN_VERSION <= api_version <= fetch.MAX_VERSION:
        read = fetch.decode_fetch_request(view, pos, api_version)
        if read is not None:
            return read
    if extensions.serves(api_key, api_version):
        return extensions.decode_request_body(api_key, api_version, view, pos)
    # the cached lookup: kio resolves the class by its module's name on every call (~5 us)
    body, _ = read_entity(request_schema(api_key, api_version), view, pos)
    return body


class BufferCollector:
    """A write-only file for kio's writers that keeps large writes as separate buffers.

    kio's writer calls ``write`` once per field; record bytes are written with one call
    of the object given, so a ``memoryview`` there ends up in ``parts`` uncopied.
    """

    __slots__ = ("cur", "parts", "threshold")

    def __init__(self, threshold: int = 2048) -> None:
        self.parts: list[wire.Buffer] = []
        self.cur = bytearray()
        self.threshold = threshold

    def write(self, data: wire.Buffer) -> int:
        """Append ``data``: copied when small, kept as its own part when large."""
        n = len(data)
        if n < self.threshold:
            self.cur += data
            return n
        if self.cur:
            self.parts.append(self.cur)
            self.cur = bytearray()
        self.parts.append(data)
        return n

    def finish(self) -> list[wire.Buffer]:
        """The collected parts, in order."""
        if self.cur:
            self.parts.append(self.cur)
            self.cur = bytearray()
        return self.parts


def encode_response(info: ResponseHeaderInfo, body: Entity) -> list[wire.Buffer]:
    """Encode a framed response (size prefix, header, body) as a list of buffers.

    ``body`` is a kio response payload for ``info.api_version``; its header version
    comes from kio (ApiVersions: always v0).
    """
    header_version = int(body.__header_schema__.__version__)  # type: ignore[attr-defined]
    out = BufferCollector()
    out.write(headers.encode_response_header(info.correlation_id, header_version))
    entity_writer(type(body))(cast(IO[bytes], out), body)
    parts = out.finish()
    parts.insert(0, SIZE.pack(sum(len(p) for p in parts)))
    return parts


@dataclass(slots=True, frozen=True)
class EncodedBody:
    """A response body encoded once, to answer several requests with (their headers differ)."""

    header_version: int
    data: bytes


def encode_response_body(body: Entity) -> EncodedBody:
    """Encode a kio response payload without its frame and header."""
    out = BufferCollector(threshold=1 << 62)  # one buffer
    entity_writer(type(body))(cast(IO[bytes], out), body)
    header_version = int(body.__header_schema__.__version__)  # type: ignore[attr-defined]
    return EncodedBody(header_version, b"".join(out.finish()))


def frame_response(info: ResponseHeaderInfo, body: EncodedBody) -> list[wire.Buffer]:
    """A framed response (size prefix, header) around an already encoded body."""
    header = headers.encode_response_header(info.correlation_id, body.header_version)
    return [SIZE.pack(len(header) + len(body.data)), header, body.data]


@functools.cache
def response_schema(api_key: int, api_version: int) -> type[Entity]:
    """kio's response class for this API version (raises ``UnsupportedVersionError``).

    Cached (both lookups): kio resolves the class by name on every call, as costly as building
    a small response.
    """
    try:
        return load_response_schema(api_key, api_version)
    except KioIndexError:
        raise UnsupportedVersionError(api_key, api_version, -1) from None


@functools.cache
def request_schema(api_key: int, api_version: int) -> type[Entity]:
    """kio's request class for this API version (raises ``UnsupportedVersionError``)."""
    try:
        return load_request_schema(api_key, api_version)
    except KioIndexError:
        raise UnsupportedVersionError(api_key, api_version, -1) from None
