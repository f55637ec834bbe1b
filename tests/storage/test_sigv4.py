"""Our SigV4 signature of a GET against botocore's, which every S3 server accepts."""

from __future__ import annotations

import urllib.parse

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials as BotocoreCredentials
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.operator import sigv4


def botocore_headers(
    host: str, path: str, headers: dict[str, str], credentials: sigv4.Credentials, region: str
) -> dict[str, str]:
    request = AWSRequest(method="GET", url=f"https://{host}{path}", headers=headers)
    # as the store's client is configured: the payload unsigned
    request.context["client_config"] = Config(s3={"payload_signing_enabled": False})
    S3SigV4Auth(
        BotocoreCredentials(credentials.access_key, credentials.secret_key, credentials.token),
        "s3",
        region,
    ).add_auth(request)
    return {k.lower(): v for k, v in request.headers.items()}


def check(
    host: str, key: str, headers: dict[str, str], credentials: sigv4.Credentials, region: str
) -> None:
    path = "/bucket/" + urllib.parse.quote(key, safe="/~")
    expected = botocore_headers(host, path, headers, credentials, region)
    ours = sigv4.sign("GET", host, path, headers, credentials, region, expected["x-amz-date"])
    assert ours["authorization"] == expected["authorization"]
    for name in ("x-amz-date", "x-amz-content-sha256", "x-amz-security-token"):
        assert ours.get(name) == expected.get(name)


@pytest.mark.parametrize("token", [None, "FQoGZXIvYXdzEJr//////////session+token="])
@pytest.mark.parametrize("byte_range", [None, "bytes=0-9", "bytes=4194304-"])
def test_a_ranged_get_is_signed_as_botocore_signs_it(
    token: str | None, byte_range: str | None
) -> None:
    secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
    credentials = sigv4.Credentials("AKIDEXAMPLE", secret, token)
    headers = {"range": byte_range} if byte_range else {}
    check("s3.eu-west-3.amazonaws.com", "ns/objects/00000042", headers, credentials, "eu-west-3")
    check("127.0.0.1:8333", "a b/ü%2F+=?&*", headers, credentials, "us-east-1")


@settings(max_examples=50, deadline=None)
@given(
    key=st.text(min_size=1, max_size=40).filter(lambda k: "\x00" not in k),
    secret=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1),
    start=st.integers(0, 1 << 40),
)
def test_any_key_and_secret(key: str, secret: str, start: int) -> None:
    check(
        "bucket.s3.amazonaws.com",
        key,
        {"range": f"bytes={start}-"},
        sigv4.Credentials("AKID", secret),
        "ap-south-1",
    )
