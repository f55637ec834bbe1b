"""Request and response headers, and which header version an API version uses.

Request header:

=======  ===============  ================  ==========================================
version  field            type              notes
=======  ===============  ================  ==========================================
0        api_key          int16             bytes 0-1 in every version
0        api_version      int16             bytes 2-3 in every version
0        correlation_id   int32             bytes 4-7 in every version
1, 2     client_id        NULLABLE_STRING   int16 length even in v2 (Kafka's special
                                            case, so ApiVersions can always be read)
2        tagged fields    TAGGED_FIELDS     none are defined; all are skipped
=======  ===============  ================  ==========================================

Response header: v0 is ``correlation_id`` (int32); v1 adds an empty TAGGED_FIELDS
(one 0x00 byte). A flexible API version uses request header v2 / response header v1,
except that ApiVersions responses always use header v0 (KIP-511), so a client can read
the answer whatever version it asked for. The versions come from kio's schema classes
(``__header_schema__``), not from a hand table.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

from kio.index import KioIndexError

from protocol import wire
from protocol.errors import InvalidRequestError
from protocol.schemas import load_request_schema, load_response_schema

_FIXED = struct.Struct(">hhi")  # api_key, api_version, correlation_id
FIXED_SIZE = _FIXED.size
_CORRELATION = struct.Struct(">i")


@dataclass(slots=True, frozen=True)
class RequestHeader:
    """A decoded request header."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None = None
    header_version: int = 2


@dataclass(slots=True, frozen=True)
class ResponseHeaderInfo:
    """What ``encode_response`` needs to frame an answer to one request."""

    api_key: int
    api_version: int
    correlation_id: int

    @classmethod
    def of(cls, header: RequestHeader) -> ResponseHeaderInfo:
        """The response header info answering ``header``."""
        return cls(header.api_key, header.api_version, header.correlation_id)


@functools.cache
def request_header_version(api_key: int, api_version: int) -> int | None:
    """Request header version (1 or 2) kio defines for this API version, else None."""
    try:
        schema = load_request_schema(api_key, api_version)
    except KioIndexError:
        return None
    return int(schema.__header_schema__.__version__)


@functools.cache
def response_header_version(api_key: int, api_version: int) -> int | None:
    """Response header version (0 or 1) kio defines for this API version, else None."""
    try:
        schema = load_response_schema(api_key, api_version)
    except KioIndexError:
        return None
    return int(schema.__header_schema__.__version__)


def peek_request_ids(frame: wire.Buffer) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id): the fixed first 8 bytes of any header."""
    if len(frame) < FIXED_SIZE:
        raise InvalidRequestError(f"request header needs {FIXED_SIZE} bytes, got {len(frame)}")
    api_key, api_version, correlation_id = _FIXED.unpack_from(frame, 0)
    return api_key, api_version, correlation_id


def decode_request_header(
    frame: wire.Buffer, header_version: int, ids: tuple[int, int, int] | None = None
) -> tuple[RequestHeader, int]:
    """Decode a request header of ``header_version``; return it and the body offset.
    ``ids``: what :func:`peek_request_ids` returned for ``frame``, when the caller has it.

    Unknown tagged fields (v2) are skipped. Errors carry the correlation id when the
    first 8 bytes were present.
    """
    api_key, api_version, correlation_id = ids if ids is not None else peek_request_ids(frame)
    pos = FIXED_SIZE
    client_id = None
    try:
        if header_version >= 1:
            client_id, pos = wire.read_nullable_string(frame, pos)
        if header_version >= 2:
            pos = wire.skip_tagged_fields(frame, pos)
    except InvalidRequestError as e:
        raise InvalidRequestError(f"request header: {e}", correlation_id) from None
    header = RequestHeader(api_key, api_version, correlation_id, client_id, header_version)
    return header, pos


def encode_request_header(header: RequestHeader) -> bytes:
    """Encode a request header (for clients and tests)."""
    out = _FIXED.pack(header.api_key, header.api_version, header.correlation_id)
    if header.header_version >= 1:
        out += wire.encode_nullable_string(header.client_id)
    if header.header_version >= 2:
        out += b"\x00"
    return out


def encode_response_header(correlation_id: int, header_version: int) -> bytes:
    """Encode a response header v0 (correlation id) or v1 (+ empty tagged fields)."""
    out = _CORRELATION.pack(correlation_id)
    return out + b"\x00" if header_version >= 1 else out


def decode_response_header(frame: wire.Buffer, header_version: int) -> tuple[int, int]:
    """Decode a response header; return (correlation_id, body offset). For tests/clients."""
    correlation_id, pos = wire.read_int32(frame, 0)
    if header_version >= 1:
        pos = wire.skip_tagged_fields(frame, pos)
    return correlation_id, pos
