"""The ApiVersions response, built from the broker's table of supported versions.

ApiVersions response body (header is always response header v0, KIP-511):

=========================  ========  ===========================================
field                      versions  type
=========================  ========  ===========================================
error_code                 0+        int16
api_keys                   0+        ARRAY of (api_key int16, min_version int16,
                                     max_version int16)
throttle_time_ms           1+        int32
supported_features         3+        tagged 0: ARRAY of (name, min_version,
                                     max_version); v3 leaves out features whose
                                     min_version is 0
finalized_features_epoch   3+        tagged 1: int64, -1 when none is finalized
finalized_features         3+        tagged 2: ARRAY of (name, max_version_level,
                                     min_version_level), both the level in force
=========================  ========  ===========================================

KIP-511: when a client asks for an ApiVersions version the broker does not know, the
broker answers in v0 with UNSUPPORTED_VERSION (35) and its api_keys, so the client can
pick a version both sides support and ask again.
"""

from __future__ import annotations

import datetime
import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kio.static.primitive import i16, i32Timedelta, i64

from protocol import wire
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.headers import ResponseHeaderInfo
from protocol.messages import encode_response, response_schema

API_KEY = ApiKey.API_VERSIONS


@dataclass(slots=True, frozen=True)
class Feature:
    """A feature flag (KIP-584) the broker supports from ``min_version`` to ``max_version``,
    in force at level ``finalized``."""

    name: str
    min_version: int
    max_version: int
    finalized: int


def build_api_versions_response(
    version: int,
    supported: Mapping[int, tuple[int, int]],
    error_code: ErrorCode = ErrorCode.NONE,
    throttle_time_ms: int = 0,
    features: Sequence[Feature] = (),
    features_epoch: int = -1,
) -> Any:
    """The kio ``ApiVersionsResponse`` of ``version`` listing ``supported`` (sorted by key)
    and, from v3, ``features`` finalized at ``features_epoch``."""
    schema = response_schema(API_KEY, version)
    # kio defines the nested structs in the same module as each response.
    module = importlib.import_module(schema.__module__)
    keys = tuple(
        module.ApiVersion(api_key=i16(key), min_version=i16(lo), max_version=i16(hi))
        for key, (lo, hi) in sorted(supported.items())
    )
    kwargs: dict[str, Any] = {"error_code": error_code, "api_keys": keys}
    if version >= 1:
        kwargs["throttle_time"] = i32Timedelta.parse(
            datetime.timedelta(milliseconds=throttle_time_ms)
        )
    if version >= 3 and features:
        kwargs["supported_features"] = tuple(
            module.SupportedFeatureKey(
                name=f.name, min_version=i16(f.min_version), max_version=i16(f.max_version)
            )
            for f in features
            # Kafka's v3 answer leaves these out: v3 clients took min 0 for "not supported"
            if version >= 4 or f.min_version > 0
        )
        kwargs["finalized_features_epoch"] = i64(features_epoch)
        kwargs["finalized_features"] = tuple(
            module.FinalizedFeatureKey(
                name=f.name, max_version_level=i16(f.finalized), min_version_level=i16(f.finalized)
            )
            for f in features
        )
    return schema(**kwargs)


def encode_api_versions_response(
    correlation_id: int,
    version: int,
    supported: Mapping[int, tuple[int, int]],
    throttle_time_ms: int = 0,
) -> list[wire.Buffer]:
    """A framed ApiVersions response; an unknown ``version`` gets the KIP-511 v0 answer."""
    lo, hi = supported.get(API_KEY, (0, -1))
    if not lo <= version <= hi:
        return encode_unsupported_api_versions(correlation_id, supported)
    body = build_api_versions_response(version, supported, ErrorCode.NONE, throttle_time_ms)
    return encode_response(ResponseHeaderInfo(API_KEY, version, correlation_id), body)


def encode_unsupported_api_versions(
    correlation_id: int, supported: Mapping[int, tuple[int, int]]
) -> list[wire.Buffer]:
    """KIP-511: a v0 response with UNSUPPORTED_VERSION and the supported ranges."""
    body = build_api_versions_response(0, supported, ErrorCode.UNSUPPORTED_VERSION)
    return encode_response(ResponseHeaderInfo(API_KEY, 0, correlation_id), body)
