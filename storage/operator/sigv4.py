"""AWS Signature Version 4 for the S3 requests :class:`~storage.operator.s3.S3ObjectStore` sends
without botocore: ranged GETs, which cold reads issue by the hundred.

botocore builds each request through its whole machinery (parameter validation, endpoint rules,
a dozen event hooks, response parsing): ~1 ms of CPU per GET on the event loop, more than the
body's bytes cost at a few MiB. A GET has no body and no query, so its signature is short work:
the canonical request over the headers sent, the string to sign, an HMAC with the day's key.
The payload is sent unsigned (``UNSIGNED-PAYLOAD``, which S3 accepts for any request), as the
store's botocore client does (``payload_signing_enabled`` off).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
SERVICE = "s3"


@dataclass(frozen=True, slots=True)
class Credentials:
    access_key: str
    secret_key: str
    token: str | None = None


@lru_cache(maxsize=8)
def _signing_key(secret_key: str, day: str, region: str, service: str) -> bytes:
    key = hmac.new(f"AWS4{secret_key}".encode(), day.encode(), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def sign(
    method: str,
    host: str,
    path: str,
    headers: Mapping[str, str],
    credentials: Credentials,
    region: str,
    amz_date: str,
) -> dict[str, str]:
    """The headers to send for ``method path`` on ``host``: ``headers`` (lower-case names) plus
    ``host``, ``x-amz-date``, ``x-amz-content-sha256`` (unsigned payload), the session token if
    any, and ``authorization``. ``path`` is sent as given, already percent-encoded, with no
    query; ``amz_date`` is ``YYYYMMDDTHHMMSSZ`` (UTC)."""
    signed = {k.lower(): v.strip() for k, v in headers.items()}
    signed["host"] = host
    signed["x-amz-date"] = amz_date
    signed["x-amz-content-sha256"] = UNSIGNED_PAYLOAD
    if credentials.token:
        signed["x-amz-security-token"] = credentials.token
    names = sorted(signed)
    signed_names = ";".join(names)
    canonical = "\n".join(
        (
            method,
            path,
            "",  # no query
            "".join(f"{name}:{signed[name]}\n" for name in names),
            signed_names,
            UNSIGNED_PAYLOAD,
        )
    )
    day = amz_date[:8]
    scope = f"{day}/{region}/{SERVICE}/aws4_request"
    to_sign = "\n".join(
        (ALGORITHM, amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest())
    )
    key = _signing_key(credentials.secret_key, day, region, SERVICE)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    signed["authorization"] = (
        f"{ALGORITHM} Credential={credentials.access_key}/{scope}, "
        f"SignedHeaders={signed_names}, Signature={signature}"
    )
    return signed
