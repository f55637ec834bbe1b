"""Object stores (AutoMQ's ``operator`` package): S3 through aiobotocore, or a local directory.

``open_object_store(url)`` picks one from a url:

* ``file:///abs/dir`` — :class:`LocalObjectStore` on that directory;
* ``s3://BUCKET?endpoint=http://127.0.0.1:8333&region=us-east-1&pathStyle=true&accessKey=AK&secretKey=SK``
  — :class:`S3ObjectStore`. Every parameter is optional: no endpoint means AWS, region defaults
  to us-east-1, pathStyle to true, and missing keys fall back to ``AWS_ACCESS_KEY_ID`` /
  ``AWS_SECRET_ACCESS_KEY`` (then to botocore's usual credential chain).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from storage.operator.base import (
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStore,
    ObjectStoreError,
    RequestStats,
)
from storage.operator.local import LocalObjectStore

if TYPE_CHECKING:
    from storage.operator.s3 import S3ObjectStore

__all__ = [
    "LocalObjectStore",
    "ObjectInfo",
    "ObjectNotFoundError",
    "ObjectStore",
    "ObjectStoreError",
    "RequestStats",
    "S3ObjectStore",
    "open_object_store",
]

_S3_PARAMS = ("endpoint", "region", "pathStyle", "accessKey", "secretKey")


def __getattr__(name: str) -> Any:
    # aiobotocore and aiohttp take ~0.2 s to import: only what uses S3 pays for them (the
    # upload worker of a broker on a file:// store starts without them)
    if name == "S3ObjectStore":
        from storage.operator.s3 import S3ObjectStore

        return S3ObjectStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_object_store(
    url: str,
    *,
    part_size: int = 16 << 20,
    max_concurrency: int = 32,
    retry_timeout_s: float = 120.0,
) -> ObjectStore:
    """Build the object store a ``file://`` or ``s3://`` url names (see the module docstring).

    Raises ValueError naming what is wrong with a malformed url.
    """
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file url {url!r}: host {parts.netloc!r} is not supported")
        if parts.query or parts.fragment:
            raise ValueError(f"file url {url!r}: takes no query or fragment")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ValueError(f"file url {url!r}: the path must be absolute (file:///abs/dir)")
        return LocalObjectStore(path, part_size=part_size)
    if parts.scheme == "s3":
        return _open_s3(url, part_size, max_concurrency, retry_timeout_s)
    raise ValueError(f"object store url {url!r}: scheme must be file:// or s3://")


def _open_s3(url: str, part_size: int, max_concurrency: int, retry_timeout_s: float) -> ObjectStore:
    parts = urlsplit(url)
    bucket = parts.netloc
    if not bucket:
        raise ValueError(f"s3 url {url!r}: no bucket (s3://BUCKET?endpoint=...)")
    if "@" in bucket or ":" in bucket:
        raise ValueError(f"s3 url {url!r}: bucket {bucket!r} must be a plain bucket name")
    if parts.path not in ("", "/"):
        raise ValueError(f"s3 url {url!r}: key prefixes in the path are not supported")
    if parts.fragment:
        raise ValueError(f"s3 url {url!r}: takes no fragment")
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as e:
        raise ValueError(f"s3 url {url!r}: malformed query: {e}") from None
    unknown = sorted(set(query) - set(_S3_PARAMS))
    if unknown:
        raise ValueError(
            f"s3 url {url!r}: unknown parameter(s) {', '.join(unknown)}; "
            f"expected {', '.join(_S3_PARAMS)}"
        )
    params: dict[str, str] = {}
    for name, values in query.items():
        if len(values) > 1:
            raise ValueError(f"s3 url {url!r}: parameter {name} given more than once")
        params[name] = values[0]

    endpoint = params.get("endpoint") or None
    if endpoint is not None:
        endpoint_parts = urlsplit(endpoint)
        if endpoint_parts.scheme not in ("http", "https") or not endpoint_parts.netloc:
            raise ValueError(f"s3 url {url!r}: endpoint {endpoint!r} must be http(s)://host[:port]")
    path_style_text = params.get("pathStyle", "true").lower()
    if path_style_text not in ("true", "false"):
        raise ValueError(f"s3 url {url!r}: pathStyle must be true or false")
    access_key = params.get("accessKey") or os.environ.get("AWS_ACCESS_KEY_ID")
    secret_key = params.get("secretKey") or os.environ.get("AWS_SECRET_ACCESS_KEY")
    if (access_key is None) != (secret_key is None):
        raise ValueError(f"s3 url {url!r}: give both accessKey and secretKey, or neither")
    from storage.operator.s3 import S3ObjectStore

    return S3ObjectStore(
        bucket,
        endpoint=endpoint,
        region=params.get("region") or "us-east-1",
        access_key=access_key,
        secret_key=secret_key,
        path_style=path_style_text == "true",
        part_size=part_size,
        max_concurrency=max_concurrency,
        retry_timeout_s=retry_timeout_s,
    )
