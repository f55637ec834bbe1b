"""Request/response headers: round trips, header version choice, tagged fields."""

from __future__ import annotations

import pytest

from protocol import headers
from protocol.errors import InvalidRequestError
from tests.protocol.kafka_oracle import uvarint


@pytest.mark.parametrize("version", [0, 1, 2])
@pytest.mark.parametrize("client_id", [None, "", "client-ü"])
def test_request_header_round_trip(version: int, client_id: str | None) -> None:
    header = headers.RequestHeader(3, 12, -5, client_id if version else None, version)
    data = headers.encode_request_header(header) + b"body"
    decoded, pos = headers.decode_request_header(data, version)
    assert decoded == header
    assert data[pos:] == b"body"


@pytest.mark.parametrize("version", [0, 1])
def test_response_header_round_trip(version: int) -> None:
    data = headers.encode_response_header(123456, version)
    assert len(data) == 4 + version
    assert headers.decode_response_header(data + b"x", version) == (123456, 4 + version)


def test_unknown_tagged_fields_in_request_header_are_skipped() -> None:
    plain = headers.encode_request_header(headers.RequestHeader(0, 9, 1, "c", 2))
    tags = uvarint(2) + uvarint(5) + uvarint(3) + b"abc" + uvarint(300) + uvarint(0)
    data = plain[:-1] + tags + b"BODY"
    decoded, pos = headers.decode_request_header(data, 2)
    assert decoded.client_id == "c"
    assert data[pos:] == b"BODY"


def test_truncated_header_keeps_correlation_id() -> None:
    data = headers.encode_request_header(headers.RequestHeader(3, 1, 42, "client", 1))
    with pytest.raises(InvalidRequestError) as info:
        headers.decode_request_header(data[:-2], 1)
    assert info.value.correlation_id == 42
    with pytest.raises(InvalidRequestError) as info:
        headers.decode_request_header(data[:5], 1)
    assert info.value.correlation_id is None


def test_header_versions_come_from_kio() -> None:
    assert headers.request_header_version(18, 2) == 1
    assert headers.request_header_version(18, 3) == 2
    assert headers.request_header_version(0, 8) == 1
    assert headers.request_header_version(0, 9) == 2
    assert headers.request_header_version(1, 11) == 1
    assert headers.request_header_version(1, 12) == 2
    assert headers.request_header_version(999, 0) is None
    assert headers.request_header_version(3, 999) is None
    # KIP-511: ApiVersions responses always use header v0.
    assert [headers.response_header_version(18, v) for v in range(5)] == [0] * 5
    assert headers.response_header_version(3, 8) == 0
    assert headers.response_header_version(3, 9) == 1
