"""S3ObjectStore: the object store over S3 (or an S3-compatible server) through aiobotocore;
ranged GETs, the cold read path's requests, go out through aiohttp directly
(:mod:`storage.operator.s3_get`), signed by :mod:`storage.operator.sigv4`.

Every request runs under one semaphore (``max_concurrency``, also the connection pool size) and
in our own retry loop: 5xx, throttling and connection errors are retried with exponential
backoff and jitter until ``retry_timeout_s`` has passed since the first attempt; other 4xx fail
at once. botocore's own retries are off so that this loop is the only one.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import random
import socket
import ssl
import struct
import time
import urllib.parse
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import botocore.exceptions
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import ClientError

from storage.heap import heap_buffer
from storage.operator import sigv4
from storage.operator.base import (
    DELETE_BATCH,
    LIST_PAGE,
    MAX_PART_SIZE,
    MIN_PART_SIZE,
    CopyPart,
    Data,
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStore,
    ObjectStoreError,
    ObjectUpload,
    RequestStats,
    SourceRange,
    UploadPart,
    as_buffers,
    check_range,
    check_sources,
    join,
    plan_compose,
    plan_put_parts,
    slice_buffers,
)
from storage.operator.s3_get import (
    S3Getter,
    session_credentials,
    ssl_context,
    static_credentials,
)

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client
    from types_aiobotocore_s3.type_defs import CompletedPartTypeDef

log = logging.getLogger("automq.s3")

T = TypeVar("T")

_BACKOFF_START_S = 0.1
_BACKOFF_CAP_S = 2.0
# An abort cleans up after a failure that is being reported anyway: do not stall on it.
_ABORT_TIMEOUT_S = 10.0
# Uploaded compose parts hold their downloaded bytes (up to ~3 x 5 MiB) until sent.
_COMPOSE_PARTS_IN_FLIGHT = 8
# A paced PUT's socket is set to its rate times this, never slower than the floor: an object is
# sent well within its share of the upload's time (the kernel's pacing measured ~0.7 of the
# rate set, on loopback), its bytes still spread over it.
_PACE_HEADROOM = 2.0
_PACE_FLOOR_BPS = 8 << 20
# Linux's SO_MAX_PACING_RATE (asm-generic/socket.h; not in Python's socket module): the kernel
# paces what the socket sends at most this many bytes/s. ~0 lifts the cap.
_SO_MAX_PACING_RATE = 47
_UNPACED = 0xFFFFFFFF
_LIFT_CHECK_S = 0.05  # a paced PUT's next part notices a lift of its pacing within this long

# Error codes S3 uses for throttling and transient server trouble (some come with a 4xx).
_RETRYABLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequests",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",
    }
)
_RETRYABLE_EXCEPTIONS: tuple[type[Exception], ...] = (
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectTimeoutError,
    botocore.exceptions.HTTPClientError,  # ConnectionClosedError, ReadTimeoutError, streaming
    botocore.exceptions.IncompleteReadError,
    aiohttp.ClientError,
    OSError,
    asyncio.TimeoutError,
)


class S3ObjectStore(ObjectStore):
    """Objects in one S3 bucket."""

    def __init__(
        self,
        bucket: str,
        *,
        endpoint: str | None = None,
        region: str = "us-east-1",
        access_key: str | None = None,
        secret_key: str | None = None,
        path_style: bool = True,
        part_size: int = 16 << 20,
        max_concurrency: int = 32,
        retry_timeout_s: float = 120.0,
    ) -> None:
        if not bucket:
            raise ValueError("bucket must not be empty")
        if not MIN_PART_SIZE <= part_size <= 5 << 30:
            raise ValueError(f"S3 part size must be in [5 MiB, 5 GiB], got {part_size}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        if retry_timeout_s < 0:
            raise ValueError(f"retry_timeout_s must not be negative, got {retry_timeout_s}")
        self.bucket = bucket
        self.endpoint = endpoint
        self.region = region
        self.part_size = part_size
        self.max_concurrency = max_concurrency
        self.retry_timeout_s = retry_timeout_s
        self.stats = RequestStats()
        self._access_key = access_key
        self._secret_key = secret_key
        self._path_style = path_style
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._start_lock = asyncio.Lock()
        self._exit_stack = AsyncExitStack()
        self._session = get_session()
        self._client: S3Client | None = None
        self._getter: S3Getter | None = None
        # paced PUTs go through a client of their own, whose sockets the kernel paces
        self._paced_client: S3Client | None = None
        self._paced_sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._pace_bps = _UNPACED
        self._lifts = 0  # lift_pacing() calls: a paced PUT started before one goes unpaced
        self._closed = False

    def __repr__(self) -> str:
        return f"S3ObjectStore(bucket={self.bucket!r}, endpoint={self.endpoint!r})"

    async def start(self) -> None:
        """Open the client (done on first use otherwise)."""
        await self._get_client()

    async def close(self) -> None:
        """Close the client and its connections."""
        self._closed = True
        self._client = None
        self._getter = None
        self._paced_client = None
        await self._exit_stack.aclose()

    async def connect(self) -> None:
        # botocore loads its S3 service model (JSON, ~150 ms) when the client is made: at
        # startup, not inside the first upload while produce requests wait on the loop
        await self._get_client()

    async def put(self, key: str, data: Data, *, rate: float | None = None) -> None:
        """PutObject, or a multipart upload above ``part_size``: parts sent concurrently, or
        one at a time at ``rate``.

        With ``rate``, the bytes also leave at about that rate (faster, see
        ``_PACE_HEADROOM``): the kernel paces the socket. Sent at full speed, a 13 MB PUT to
        an S3 server on the same host took its ~0.1 s in one burst of CPU (ours, the kernel's
        loopback, the server's) that delayed the broker's WAL writes and its clients by tens
        of milliseconds, at every object.
        """
        buffers = as_buffers(data)
        total = sum(len(b) for b in buffers)
        if rate:
            self._set_pace(rate)
        lifts = self._lifts
        if total <= self.part_size:
            await self._put_object(key, await _joined(buffers), paced=bool(rate))
            return
        ranges = plan_put_parts(total, self.part_size)
        started = asyncio.get_running_loop().time()
        parts = [
            self._upload_part_fn(key, number, slice_buffers(buffers, start, end), bool(rate))
            for number, (start, end) in enumerate(ranges, 1)
        ]
        if rate:
            parts = [
                _paced(part, started + start / rate, lambda: self._lifts != lifts)
                for part, (start, _) in zip(parts, ranges, strict=True)
            ]
        await self._multipart(
            key, total, parts, parts_in_flight=1 if rate else self.max_concurrency
        )

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Ranged GetObject; a range starting at or past the end (HTTP 416) gives ``b""``."""
        check_range(start, end)
        if end == start:
            # An empty HTTP range cannot be expressed; still report a missing object.
            await self.size(key)
            return b""
        getter = await self._get_getter()
        if end is not None:
            byte_range = f"bytes={start}-{end - 1}"
        elif start > 0:
            byte_range = f"bytes={start}-"
        else:
            byte_range = ""

        async def attempt() -> bytes:
            self.stats.get += 1
            try:
                data = await getter.get(key, byte_range)
            except ClientError as e:
                if _status(e) == 416 or _code(e) == "InvalidRange":
                    return b""
                raise
            self.stats.bytes_get += len(data)
            return data

        return await self._call("GetObject", key, attempt)

    async def get_view(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Ranged GetObject, the body's chunks copied as they come into a :func:`heap_buffer`
        (see :meth:`ObjectStore.get_view`), not joined into new bytes: memory the process has
        not used before costs the kernel's zeroing and a page fault per 4 KiB."""
        check_range(start, end)
        if end <= start:
            return await self.get(key, start, end)
        getter = await self._get_getter()
        buffer = heap_buffer(end - start, populate=True)
        byte_range = f"bytes={start}-{end - 1}"

        async def attempt() -> memoryview:
            self.stats.get += 1
            try:
                got = await getter.get_into(key, byte_range, buffer)
            except ClientError as e:
                if _status(e) == 416 or _code(e) == "InvalidRange":
                    return memoryview(b"")
                raise
            self.stats.bytes_get += got
            return memoryview(buffer)[:got].toreadonly()

        return await self._call("GetObject", key, attempt)

    async def size(self, key: str) -> int:
        """HeadObject's ContentLength."""
        client = await self._get_client()

        async def attempt() -> int:
            self.stats.head += 1
            response = await client.head_object(Bucket=self.bucket, Key=key)
            return response["ContentLength"]

        return await self._call("HeadObject", key, attempt)

    async def compose(self, key: str, sources: Sequence[SourceRange]) -> None:
        """Multipart upload with UploadPartCopy for large ranges, GET + UploadPart for small."""
        check_sources(sources)
        total = sum(end - start for _, start, end in sources)
        if total < MIN_PART_SIZE:
            chunks = await asyncio.gather(*(self._get_exact(source) for source in sources))
            await self._put_object(key, b"".join(chunks))
            return
        factories: builtins.list[Callable[[str], Awaitable[CompletedPartTypeDef]]] = []
        for number, part in enumerate(plan_compose(sources), 1):
            if isinstance(part, CopyPart):
                factories.append(self._copy_part_fn(key, number, part.source))
            else:
                factories.append(self._compose_upload_part_fn(key, number, part))
        await self._multipart(key, total, factories, parts_in_flight=_COMPOSE_PARTS_IN_FLIGHT)

    def upload(self, key: str) -> ObjectUpload:
        """A multipart upload whose parts are sent as they fill (see ``S3Upload``)."""
        return S3Upload(self, key)

    async def delete(self, keys: Sequence[str]) -> None:
        """DeleteObjects in batches of 1,000 keys, sent concurrently."""
        batches = [keys[i : i + DELETE_BATCH] for i in range(0, len(keys), DELETE_BATCH)]
        await _run_all([self._delete_batch_fn(batch) for batch in batches], self.max_concurrency)

    # -- request helpers ------------------------------------------------------------------

    async def _get_client(self, paced: bool = False) -> S3Client:
        """The client; with ``paced``, the one whose sockets are paced (made on first use)."""
        client = self._paced_client if paced else self._client
        if client is not None:
            return client
        async with self._start_lock:
            if self._closed:
                raise ObjectStoreError(f"{self!r} is closed")
            if paced and self._paced_client is None:
                self._paced_client = await self._new_client({"socket_factory": self._paced_socket})
            elif not paced and self._client is None:
                self._client = await self._new_client(None)
            client = self._paced_client if paced else self._client
            assert client is not None
            return client

    async def _get_getter(self) -> S3Getter:
        """The GET path (made on first use, after the client it takes its url from)."""
        if self._getter is not None:
            return self._getter
        client = await self._get_client()
        async with self._start_lock:
            if self._closed:
                raise ObjectStoreError(f"{self!r} is closed")
            if self._getter is None:
                # botocore's endpoint rules say where the bucket's objects are (path-style or
                # virtual-hosted, the region's host): read once off a presigned url
                probe = "k"
                url = urllib.parse.urlsplit(
                    await client.generate_presigned_url(
                        "get_object", Params={"Bucket": self.bucket, "Key": probe}
                    )
                )
                if not url.path.endswith("/" + probe):
                    raise ObjectStoreError(f"{self!r}: no object url in {url.geturl()!r}")
                if self._access_key and self._secret_key:
                    static = sigv4.Credentials(self._access_key, self._secret_key)
                    credentials: Callable[[], Awaitable[sigv4.Credentials]] = static_credentials(
                        static
                    )
                else:
                    credentials = session_credentials(await self._session.get_credentials())
                tls: ssl.SSLContext | bool = False
                if url.scheme == "https":
                    # (it reads the CA bundle: off the loop)
                    tls = await asyncio.to_thread(ssl_context)
                getter = S3Getter(
                    origin=f"{url.scheme}://{url.netloc}",
                    host=url.netloc,
                    path_prefix=url.path[: -len(probe)],
                    region=client.meta.region_name or self.region,
                    credentials=credentials,
                    limit=self.max_concurrency,
                    ssl_context=tls,
                )
                self._exit_stack.push_async_callback(getter.close)
                self._getter = getter
            return self._getter

    async def _new_client(self, connector_args: dict[str, object] | None) -> S3Client:
        config = AioConfig(
            connector_args=connector_args,
            s3={
                "addressing_style": "path" if self._path_style else "virtual",
                # a SHA-256 of every part would run on the event loop; integrity
                # comes from TLS on real endpoints and from our own CRCs
                "payload_signing_enabled": False,
            },
            # total_max_attempts=1 turns botocore's retries off in every retry mode
            # (its "max_attempts": 1 would still retry once in legacy mode).
            retries={"total_max_attempts": 1},
            connect_timeout=5,
            read_timeout=30,
            max_pool_connections=self.max_concurrency,
            # Checksums only where S3 demands them: S3-compatible servers vary in
            # their support and TCP already protects the bytes on the wire.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        return await self._exit_stack.enter_async_context(
            self._session.create_client(
                "s3",
                endpoint_url=self.endpoint,
                region_name=self.region,
                aws_access_key_id=self._access_key,
                aws_secret_access_key=self._secret_key,
                config=config,
            )
        )

    def _paced_socket(self, addr_info: tuple[Any, ...]) -> socket.socket:
        """The paced client's socket factory: a socket at the current pace."""
        family, type_, proto, _, _ = addr_info
        sock = socket.socket(family=family, type=type_, proto=proto)
        _set_pacing(sock, self._pace_bps)
        self._paced_sockets.add(sock)
        return sock

    def lift_pacing(self) -> None:
        """The paced PUTs in progress go on at full speed: their sockets unpaced, their
        remaining parts sent without waiting for their time."""
        self._lifts += 1
        self._set_pace_bps(_UNPACED)

    def _set_pace(self, rate: float) -> None:
        """Pace the paced client's sockets, open and future, for ``rate`` bytes/s."""
        self._set_pace_bps(min(max(int(rate * _PACE_HEADROOM), _PACE_FLOOR_BPS), _UNPACED))

    def _set_pace_bps(self, bps: int) -> None:
        if bps == self._pace_bps:
            return
        self._pace_bps = bps
        for sock in list(self._paced_sockets):
            _set_pacing(sock, bps)

    async def _call(
        self,
        operation: str,
        key: str,
        attempt: Callable[[], Awaitable[T]],
        timeout_s: float | None = None,
    ) -> T:
        """Run ``attempt`` under the semaphore, retrying transient failures until timeout."""
        loop = asyncio.get_running_loop()
        first = loop.time()
        deadline = first + (self.retry_timeout_s if timeout_s is None else timeout_s)
        number = 0
        while True:
            number += 1
            try:
                async with self._semaphore:
                    started = time.perf_counter()
                    try:
                        result = await attempt()
                    except BaseException:
                        self.stats.timed(operation, time.perf_counter() - started, True)
                        raise
                    self.stats.timed(operation, time.perf_counter() - started, False)
                    return result
            except ClientError as e:
                if not _retryable(e):
                    if _code(e) in ("NoSuchKey", "NotFound") or (
                        _status(e) == 404 and _code(e) == "404"
                    ):
                        raise ObjectNotFoundError(key) from e
                    raise ObjectStoreError(
                        f"{operation} {key!r} failed: {_code(e)} (HTTP {_status(e)}): {_message(e)}"
                    ) from e
                error: Exception = e
            except _RETRYABLE_EXCEPTIONS as e:
                error = e
            now = loop.time()
            if now >= deadline:
                raise ObjectStoreError(
                    f"{operation} {key!r} failed after {number} attempts in "
                    f"{now - first:.1f}s: {error!r}"
                ) from error
            # Exponential backoff with "equal jitter": at least half the step, never past the
            # deadline (one last attempt runs right at it).
            step = min(_BACKOFF_CAP_S, _BACKOFF_START_S * 2 ** min(number - 1, 16))
            delay = min(step / 2 + random.uniform(0, step / 2), deadline - now)
            log.warning(
                "%s %r attempt %d failed, retrying in %.2fs: %r",
                operation,
                key,
                number,
                delay,
                error,
            )
            await asyncio.sleep(delay)

    async def _put_object(self, key: str, body: bytes | bytearray, paced: bool = False) -> None:
        client = await self._get_client(paced)

        async def attempt() -> None:
            self.stats.put += 1
            await client.put_object(Bucket=self.bucket, Key=key, Body=body)  # type: ignore[arg-type]  # (botocore takes bytearray)
            self.stats.bytes_put += len(body)

        await self._call("PutObject", key, attempt)

    async def _get_exact(self, source: SourceRange) -> bytes:
        key, start, end = source
        if start == end:
            return b""
        data = await self.get(key, start, end)
        if len(data) != end - start:
            raise ObjectStoreError(
                f"compose: source range [{start}, {end}) of {key!r} is past its end "
                f"({start + len(data)} bytes)"
            )
        return data

    async def _multipart(
        self,
        key: str,
        total: int,
        part_factories: Sequence[Callable[[str], Awaitable[CompletedPartTypeDef]]],
        parts_in_flight: int,
    ) -> None:
        """Create an upload, run the parts, complete it; abort it if anything fails."""
        client = await self._get_client()

        async def create() -> str:
            self.stats.multipart_create += 1
            response = await client.create_multipart_upload(Bucket=self.bucket, Key=key)
            return response["UploadId"]

        upload_id = await self._call("CreateMultipartUpload", key, create)
        try:
            parts = await _run_all(
                [_bind(factory, upload_id) for factory in part_factories], parts_in_flight
            )
            await self._complete(key, upload_id, total, parts)
        except BaseException:
            await self._abort(key, upload_id)
            raise

    async def _complete(
        self, key: str, upload_id: str, total: int, parts: Sequence[CompletedPartTypeDef]
    ) -> None:
        client = await self._get_client()
        attempts = 0

        async def attempt() -> None:
            nonlocal attempts
            attempts += 1
            self.stats.multipart_complete += 1
            try:
                await client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": builtins.list(parts)},
                )
            except ClientError as e:
                # A retry after a lost reply finds the upload gone: done if the object is there.
                if not (attempts > 1 and _code(e) == "NoSuchUpload"):
                    raise
                self.stats.head += 1
                response = await client.head_object(Bucket=self.bucket, Key=key)
                if response["ContentLength"] != total:
                    raise

        await self._call("CompleteMultipartUpload", key, attempt)

    async def _abort(self, key: str, upload_id: str) -> None:
        client = await self._get_client()
        try:
            await self._call(
                "AbortMultipartUpload",
                key,
                lambda: client.abort_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload_id
                ),
                timeout_s=_ABORT_TIMEOUT_S,
            )
        except (ObjectStoreError, ObjectNotFoundError) as e:
            # The upload stays behind for a bucket lifecycle rule to collect.
            log.warning("could not abort multipart upload %s of %r: %s", upload_id, key, e)

    def _upload_part_fn(
        self, key: str, number: int, buffers: Sequence[memoryview], paced: bool
    ) -> Callable[[str], Awaitable[CompletedPartTypeDef]]:
        async def run(upload_id: str) -> CompletedPartTypeDef:
            body = await _joined(buffers)
            return await self._upload_part(key, upload_id, number, body, paced)

        return run

    async def _upload_part(
        self, key: str, upload_id: str, number: int, body: bytes | bytearray, paced: bool = False
    ) -> CompletedPartTypeDef:
        client = await self._get_client(paced)

        async def attempt() -> CompletedPartTypeDef:
            self.stats.part += 1
            response = await client.upload_part(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                Body=body,  # type: ignore[arg-type]
            )
            self.stats.bytes_put += len(body)
            return {"ETag": response["ETag"], "PartNumber": number}

        return await self._call("UploadPart", key, attempt)

    def _compose_upload_part_fn(
        self, key: str, number: int, part: UploadPart
    ) -> Callable[[str], Awaitable[CompletedPartTypeDef]]:
        async def run(upload_id: str) -> CompletedPartTypeDef:
            chunks = await asyncio.gather(*(self._get_exact(source) for source in part.sources))
            return await self._upload_part(key, upload_id, number, b"".join(chunks))

        return run

    def _copy_part_fn(
        self, key: str, number: int, source: SourceRange
    ) -> Callable[[str], Awaitable[CompletedPartTypeDef]]:
        source_key, start, end = source

        async def run(upload_id: str) -> CompletedPartTypeDef:
            client = await self._get_client()

            async def attempt() -> CompletedPartTypeDef:
                self.stats.part_copy += 1
                try:
                    response = await client.upload_part_copy(
                        Bucket=self.bucket,
                        Key=key,
                        UploadId=upload_id,
                        PartNumber=number,
                        CopySource={"Bucket": self.bucket, "Key": source_key},
                        CopySourceRange=f"bytes={start}-{end - 1}",
                    )
                except ClientError as e:
                    if _status(e) == 416 or _code(e) == "InvalidRange":
                        raise ObjectStoreError(
                            f"compose: source range [{start}, {end}) of {source_key!r} is past "
                            f"its end"
                        ) from e
                    raise
                return {"ETag": response["CopyPartResult"]["ETag"], "PartNumber": number}

            # Named by the source: a missing or short source is the likely failure.
            return await self._call("UploadPartCopy", source_key, attempt)

        return run

    def _delete_batch_fn(self, keys: Sequence[str]) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            client = await self._get_client()

            async def attempt() -> None:
                self.stats.delete += 1
                response = await client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True},
                )
                errors = [e for e in response.get("Errors", []) if e.get("Code") != "NoSuchKey"]
                if errors:
                    first = errors[0]
                    raise ObjectStoreError(
                        f"DeleteObjects failed for {len(errors)} of {len(keys)} keys, e.g. "
                        f"{first.get('Key')!r}: {first.get('Code')} {first.get('Message')}"
                    )

            await self._call("DeleteObjects", keys[0], attempt)

        return run

    async def _list_page(
        self, prefix: str, token: str | None
    ) -> tuple[builtins.list[ObjectInfo], str | None]:
        client = await self._get_client()

        async def attempt() -> tuple[builtins.list[ObjectInfo], str | None]:
            self.stats.list += 1
            if token is None:
                response = await client.list_objects_v2(
                    Bucket=self.bucket, Prefix=prefix, MaxKeys=LIST_PAGE
                )
            else:
                response = await client.list_objects_v2(
                    Bucket=self.bucket, Prefix=prefix, MaxKeys=LIST_PAGE, ContinuationToken=token
                )
            infos = [
                ObjectInfo(item["Key"], item["Size"], int(item["LastModified"].timestamp() * 1000))
                for item in response.get("Contents", [])
            ]
            more = response.get("IsTruncated", False)
            return infos, response.get("NextContinuationToken") if more else None

        return await self._call("ListObjectsV2", prefix, attempt)

    # Last in the class body: above, this name would shadow the builtin in annotations.
    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """ListObjectsV2 pages, following continuation tokens."""
        token: str | None = None
        while True:
            infos, token = await self._list_page(prefix, token)
            for info in infos:
                yield info
            if token is None:
                return


class S3Upload(ObjectUpload):
    """An object written piece by piece, holding at most about one part in memory.

    Appended bytes are sent as an UploadPart once ``part_size`` of them are pending; a copied
    range of at least 5 MiB becomes an UploadPartCopy (no download) once the pending bytes
    before it are a valid part on their own, otherwise it is downloaded and appended. An
    upload that never filled a part is one PutObject at ``finish``.
    """

    def __init__(self, store: S3ObjectStore, key: str) -> None:
        self.store = store
        self.key = key
        self.size = 0
        self._pending: builtins.list[memoryview] = []
        self._pending_size = 0
        self._upload_id: str | None = None
        self._parts: builtins.list[CompletedPartTypeDef] = []

    async def write(self, data: Data) -> None:
        for buffer in as_buffers(data):
            self._pending.append(buffer)
            self._pending_size += len(buffer)
            self.size += len(buffer)
        if self._pending_size >= self.store.part_size:
            await self._flush()

    async def copy(self, source_key: str, start: int, end: int) -> None:
        check_sources([(source_key, start, end)])
        if end - start < MIN_PART_SIZE or 0 < self._pending_size < MIN_PART_SIZE:
            data = await self.store._get_exact((source_key, start, end))
            await self.write(data)
            return
        await self._flush()
        upload_id = await self._started()
        for piece in range(start, end, MAX_PART_SIZE):
            number = len(self._parts) + 1
            copy = self.store._copy_part_fn(
                self.key, number, (source_key, piece, min(piece + MAX_PART_SIZE, end))
            )
            self._parts.append(await copy(upload_id))
        self.size += end - start

    async def finish(self) -> int:
        if self._upload_id is None:
            await self.store._put_object(self.key, join(self._pending))
        else:
            if self._pending_size or not self._parts:
                await self._flush()
            await self.store._complete(self.key, self._upload_id, self.size, self._parts)
        self._pending, self._pending_size = [], 0
        return self.size

    async def abort(self) -> None:
        self._pending, self._pending_size = [], 0
        if self._upload_id is not None:
            await self.store._abort(self.key, self._upload_id)
            self._upload_id = None

    async def _started(self) -> str:
        if self._upload_id is None:
            client = await self.store._get_client()

            async def create() -> str:
                self.store.stats.multipart_create += 1
                response = await client.create_multipart_upload(
                    Bucket=self.store.bucket, Key=self.key
                )
                return response["UploadId"]

            self._upload_id = await self.store._call("CreateMultipartUpload", self.key, create)
        return self._upload_id

    async def _flush(self) -> None:
        if not self._pending_size:
            return
        upload_id = await self._started()
        body = join(self._pending)
        self._pending, self._pending_size = [], 0
        number = len(self._parts) + 1
        self._parts.append(await self.store._upload_part(self.key, upload_id, number, body))


async def _run_all(factories: Sequence[Callable[[], Awaitable[T]]], limit: int) -> builtins.list[T]:
    """Run the coroutines, at most ``limit`` at a time; on a failure cancel the rest."""
    gate = asyncio.Semaphore(limit)

    async def gated(factory: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await factory()

    tasks = [asyncio.ensure_future(gated(factory)) for factory in factories]
    try:
        return builtins.list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _set_pacing(sock: socket.socket, bps: int) -> None:
    """Have the kernel send at most ``bps`` bytes/s on ``sock`` (where it can: Linux)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_MAX_PACING_RATE, struct.pack("=I", bps))
    except OSError as e:  # another OS, or a socket already closed: sent unpaced
        log.debug("cannot pace %r: %r", sock, e)


def _paced(
    part: Callable[[str], Awaitable[CompletedPartTypeDef]], at: float, lifted: Callable[[], bool]
) -> Callable[[str], Awaitable[CompletedPartTypeDef]]:
    """``part``, started no sooner than loop time ``at``, unless the pacing is ``lifted``
    meanwhile."""

    async def run(upload_id: str) -> CompletedPartTypeDef:
        loop = asyncio.get_running_loop()
        while (wait := at - loop.time()) > 0 and not lifted():
            await asyncio.sleep(min(wait, _LIFT_CHECK_S))
        return await part(upload_id)

    return run


def _bind(
    factory: Callable[[str], Awaitable[CompletedPartTypeDef]], upload_id: str
) -> Callable[[], Awaitable[CompletedPartTypeDef]]:
    return lambda: factory(upload_id)


def _retryable(error: ClientError) -> bool:
    status = _status(error)
    return status >= 500 or status == 429 or _code(error) in _RETRYABLE_CODES


def _status(error: ClientError) -> int:
    return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _message(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Message", ""))


async def _joined(buffers: Sequence[memoryview]) -> bytes | bytearray:
    """The buffers as one body; a copy of megabytes is made off the event loop (tens of ms on
    it), buffer by buffer, so that the loop gets the GIL back between them (one ``join`` of
    a whole object would hold it for the whole copy)."""
    if sum(len(b) for b in buffers) < _JOIN_ON_LOOP or len(buffers) == 1:
        return join(buffers)
    return await asyncio.to_thread(_copy_together, buffers)


def _copy_together(buffers: Sequence[memoryview]) -> bytearray:
    out = bytearray(sum(len(b) for b in buffers))
    view = memoryview(out)
    pos = 0
    for b in buffers:
        view[pos : pos + len(b)] = b
        pos += len(b)
    return out


_JOIN_ON_LOOP = 256 << 10
