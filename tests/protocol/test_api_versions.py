"""ApiVersions responses, including the KIP-511 answer to an unknown version."""

from __future__ import annotations

import pytest
from kafka.protocol.metadata import ApiVersionsResponse

from protocol import api_versions, messages
from protocol.errors import UnsupportedVersionError

SUPPORTED = {0: (3, 11), 1: (4, 17), 3: (1, 12), 18: (0, 4)}


def decode(parts: list[bytes | bytearray | memoryview], version: int) -> object:
    data = b"".join(bytes(p) for p in parts)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    return ApiVersionsResponse.decode(data[4:], version=version, header=True)


@pytest.mark.parametrize("version", range(0, 5))
def test_each_version_lists_the_table(version: int) -> None:
    r: object = decode(api_versions.encode_api_versions_response(3, version, SUPPORTED), version)
    assert r.header.correlation_id == 3  # type: ignore[attr-defined]
    assert r.error_code == 0  # type: ignore[attr-defined]
    got = {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}  # type: ignore[attr-defined]
    assert got == SUPPORTED


def test_unknown_version_gets_v0_with_unsupported_version() -> None:
    frame = b"\x00\x12\x00\x09\x00\x00\x00\x2a" + b"\x00\x01c" + b"\x00\x00\x00"
    with pytest.raises(UnsupportedVersionError) as info:
        messages.decode_request(frame, supported=SUPPORTED)
    err = info.value
    parts = api_versions.encode_api_versions_response(
        err.correlation_id, err.api_version, SUPPORTED
    )
    # A client that asked v9 reads the v0 body whatever it expected (KIP-511).
    r: object = decode(parts, 3)
    assert r.header.correlation_id == 42  # type: ignore[attr-defined]
    assert r.error_code == 35  # type: ignore[attr-defined]
    assert {k.api_key for k in r.api_keys} == set(SUPPORTED)  # type: ignore[attr-defined]


FEATURES = (
    api_versions.Feature("metadata.version", 7, 21, finalized=21),
    api_versions.Feature("group.version", 0, 1, finalized=1),
)


@pytest.mark.parametrize("version", [3, 4])
def test_features_are_reported_from_v3(version: int) -> None:
    """v4 lists every supported feature; v3 leaves out those whose minimum is 0 (Kafka's v3
    clients read a minimum of 0 as not supported). Both list the finalized levels."""
    body = api_versions.build_api_versions_response(
        version, SUPPORTED, features=FEATURES, features_epoch=5
    )
    supported = {(f.name, f.min_version, f.max_version) for f in body.supported_features}
    expected = {("metadata.version", 7, 21), ("group.version", 0, 1)}
    assert supported == (expected if version == 4 else {("metadata.version", 7, 21)})
    assert body.finalized_features_epoch == 5
    finalized = {
        (f.name, f.min_version_level, f.max_version_level) for f in body.finalized_features
    }
    assert finalized == {("metadata.version", 21, 21), ("group.version", 1, 1)}


def test_no_features_before_v3() -> None:
    body = api_versions.build_api_versions_response(2, SUPPORTED, features=FEATURES)
    assert not hasattr(body, "supported_features")
