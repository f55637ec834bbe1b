"""The server side of PLAIN, SCRAM-SHA-256/512 and OAUTHBEARER: exchanges with real clients'
messages (scramp's client, tokens made here), Kafka's answers to refusals, and fuzzing."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import http.server
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import jwt
import pytest
import scramp
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import given
from hypothesis import strategies as st

from automq_py.security.errors import (
    IllegalSaslStateError,
    SaslAuthenticationError,
    UnsupportedSaslMechanismError,
)
from automq_py.security.principal import KafkaPrincipal
from automq_py.security.sasl_mechanisms import (
    MECHANISMS,
    SCRAM_MAX_ITERATIONS,
    SCRAM_MIN_ITERATIONS,
    JwksValidator,
    OAuthBearerServer,
    OAuthBearerValidationError,
    PlainServer,
    SaslMechanismServer,
    ScramCredential,
    ScramServer,
    UnsecuredJwsValidator,
    salted_password,
    scram_credential,
)
from storage.config_def import ConfigError

SASL_ERRORS = (SaslAuthenticationError, IllegalSaslStateError, UnsupportedSaslMechanismError)


def failed(mechanism: str) -> str:
    return (
        "Authentication failed during authentication due to invalid credentials with SASL "
        f"mechanism {mechanism}"
    )


def test_mechanisms() -> None:
    assert MECHANISMS == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
    assert (SCRAM_MIN_ITERATIONS, SCRAM_MAX_ITERATIONS) == (4096, 16384)


# --- PLAIN -------------------------------------------------------------------------------

USERS = {"alice": "alice-secret", "bob": "bob-secret"}


async def test_plain() -> None:
    server = PlainServer(USERS)
    assert server.mechanism == "PLAIN"
    assert await server.evaluate(b"\0alice\0alice-secret") == b""
    assert server.complete
    assert server.principal == KafkaPrincipal("User", "alice")
    assert server.lifetime_ms is None
    with pytest.raises(IllegalSaslStateError):
        await server.evaluate(b"\0alice\0alice-secret")


async def test_plain_authzid() -> None:
    server = PlainServer(USERS)
    await server.evaluate(b"alice\0alice\0alice-secret")
    assert server.principal == KafkaPrincipal("User", "alice")
    with pytest.raises(SaslAuthenticationError) as e:
        await PlainServer(USERS).evaluate(b"bob\0alice\0alice-secret")
    assert str(e.value) == (
        "Authentication failed: Client requested an authorization id that is different from "
        "username"
    )


@pytest.mark.parametrize(
    "token", [b"\0alice\0wrong", b"\0mallory\0alice-secret", b"\0al\xffice\0alice-secret"]
)
async def test_plain_unknown_user_and_wrong_password_say_the_same(token: bytes) -> None:
    server = PlainServer(USERS)
    with pytest.raises(SaslAuthenticationError) as e:
        await server.evaluate(token)
    assert str(e.value) == "Authentication failed: Invalid username or password"
    assert not server.complete
    with pytest.raises(IllegalSaslStateError):
        await server.evaluate(b"\0alice\0alice-secret")


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (b"", "Invalid SASL/PLAIN response: expected 3 tokens, got 1"),
        (b"alice", "Invalid SASL/PLAIN response: expected 3 tokens, got 1"),
        (b"alice\0alice-secret", "Invalid SASL/PLAIN response: expected 3 tokens, got 2"),
        (b"\0a\0b\0c", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
        (b"\0a\0b\0c\0d\0", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
        (b"\0\0alice-secret", "Authentication failed: username not specified"),
        (b"\0alice\0", "Authentication failed: password not specified"),
    ],
)
async def test_plain_malformed(token: bytes, message: str) -> None:
    """Kafka's PlainSaslServer.extractTokens and its checks, in its words (its
    PlainSaslServerTest): none of them tells whether a user exists."""
    server = PlainServer(USERS)
    with pytest.raises(SaslAuthenticationError) as e:
        await server.evaluate(token)
    assert str(e.value) == message
    assert not server.complete


# --- SCRAM -------------------------------------------------------------------------------

SALT = b"1dl2qejbfslzp8kbjoqkrckqbq"  # shaped as Kafka's tools make salts


def credential(mechanism: str, password: str, iterations: int = 4096) -> ScramCredential:
    return scram_credential(
        mechanism, salted_password(mechanism, password, SALT, iterations), SALT, iterations
    )


def lookup_of(mechanism: str, users: dict[str, str]) -> Callable[[str], ScramCredential | None]:
    credentials = {user: credential(mechanism, pw) for user, pw in users.items()}
    return credentials.get


async def scram_exchange(server: ScramServer, user: str, password: str) -> scramp.ScramClient:
    """A whole exchange with scramp's client; raises what the server raises."""
    client = scramp.ScramClient([server.mechanism], user, password)
    server_first = await server.evaluate(client.get_client_first().encode())
    client.set_server_first(server_first.decode())
    server_final = await server.evaluate(client.get_client_final().encode())
    client.set_server_final(server_final.decode())  # checks the server's signature
    return client


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_scram(mechanism: str) -> None:
    server = ScramServer(mechanism, lookup_of(mechanism, USERS))
    await scram_exchange(server, "alice", "alice-secret")
    assert server.complete
    assert server.principal == KafkaPrincipal("User", "alice")
    assert server.lifetime_ms is None
    with pytest.raises(IllegalSaslStateError):
        await server.evaluate(b"n,,n=alice,r=abc")


def test_credentials_as_scramp_derives_them() -> None:
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        salt, stored_key, server_key, iterations = scramp.ScramMechanism(mechanism).make_auth_info(
            "pencil", 8192, SALT
        )
        assert credential(mechanism, "pencil", 8192) == ScramCredential(
            salt, stored_key, server_key, iterations
        )
    assert "pencil" not in repr(credential("SCRAM-SHA-256", "pencil"))


async def test_scram_user_names_are_saslname_decoded() -> None:
    looked_up: list[str] = []

    def lookup(user: str) -> ScramCredential | None:
        looked_up.append(user)
        return credential("SCRAM-SHA-256", "pw")

    server = ScramServer("SCRAM-SHA-256", lookup)
    await scram_exchange(server, "a,b=c", "pw")  # sent as n=a=2Cb=3Dc
    assert looked_up == ["a,b=c"]
    assert server.principal == KafkaPrincipal("User", "a,b=c")


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_scram_unknown_user_looks_like_a_wrong_password(mechanism: str) -> None:
    lookup = lookup_of(mechanism, USERS)
    firsts = []
    for user, password in [("alice", "wrong"), ("mallory", "x"), ("mallory", "y")]:
        server = ScramServer(mechanism, lookup)
        client = scramp.ScramClient([mechanism], user, password)
        # the unknown user gets a server-first message too, and the refusal comes at the end
        first = (await server.evaluate(client.get_client_first().encode())).decode()
        client.set_server_first(first)
        firsts.append(dict(item.split("=", 1) for item in first.split(",")))
        with pytest.raises(SaslAuthenticationError) as e:
            await server.evaluate(client.get_client_final().encode())
        assert str(e.value) == failed(mechanism)
        assert not server.complete
    known, unknown, again = firsts
    assert known["i"] == unknown["i"] == "4096"
    # a fake salt shaped like a real one, the same on each attempt (a new one would tell)
    assert unknown["s"] == again["s"] != known["s"]
    assert re.fullmatch(rb"[0-9a-z]{12,26}", base64.b64decode(unknown["s"]))


async def test_scram_too_few_iterations_is_refused_like_a_wrong_password() -> None:
    weak = scram_credential("SCRAM-SHA-256", b"x" * 32, SALT, 1000)
    server = ScramServer("SCRAM-SHA-256", lambda user: weak)
    with pytest.raises(SaslAuthenticationError, match=f"^{failed('SCRAM-SHA-256')}$"):
        await scram_exchange(server, "alice", "x")


async def test_scram_lookup_failure() -> None:
    def lookup(user: str) -> ScramCredential | None:
        raise RuntimeError("metadata store down")

    server = ScramServer("SCRAM-SHA-256", lookup)
    with pytest.raises(SaslAuthenticationError, match=f"^{failed('SCRAM-SHA-256')}$"):
        await server.evaluate(b"n,,n=alice,r=abcdef")


@pytest.mark.parametrize(
    "first",
    [
        b"n,,n=alice,r=abcdef,tokenauth=true",  # a delegation token: this broker has none
        b"p=tls-unique,,n=alice,r=abcdef",  # no channel binding
        b"y,,n=alice,r=abcdef",
        b"n,,n=al=ice,r=abcdef",
        b"n,,n=alice,r=abc,def",
        b"n,,n=\xc3\xa9,r=abcdef",
        b"garbage",
    ],
)
async def test_scram_client_first_refused(first: bytes) -> None:
    server = ScramServer("SCRAM-SHA-256", lookup_of("SCRAM-SHA-256", USERS))
    with pytest.raises(SaslAuthenticationError, match=f"^{failed('SCRAM-SHA-256')}$"):
        await server.evaluate(first)
    with pytest.raises(IllegalSaslStateError):
        await server.evaluate(first)


async def test_scram_authzid_of_another_user() -> None:
    server = ScramServer("SCRAM-SHA-256", lookup_of("SCRAM-SHA-256", USERS))
    with pytest.raises(SaslAuthenticationError, match="authorization id that is different"):
        await server.evaluate(b"n,a=bob,n=alice,r=abcdef")
    # an unknown user's exchange fails as any other (Kafka looks the user up first)
    stranger = ScramServer("SCRAM-SHA-256", lookup_of("SCRAM-SHA-256", USERS))
    with pytest.raises(SaslAuthenticationError, match=f"^{failed('SCRAM-SHA-256')}$"):
        await stranger.evaluate(b"n,a=bob,n=mallory,r=abcdef")


@pytest.mark.parametrize(
    ("gs2", "extensions"),
    [("n,a=alice,", ""), ("n,,", ",ext=1,traceId=t-1"), ("n,a=alice,", ",ext=1")],
)
async def test_scram_with_the_user_s_own_authzid_or_unknown_extensions(
    gs2: str, extensions: str
) -> None:
    """Kafka's ScramSaslServer takes an authorization id equal to the user name (Sarama's
    SCRAMAuthzID, franz-go's Zid) and ignores extensions it does not know; the proofs are
    over the messages as sent."""
    mechanism, digest = "SCRAM-SHA-256", "sha256"
    server = ScramServer(mechanism, lookup_of(mechanism, USERS))
    bare = f"n=alice,r=fyko+d2lbbFgONRv9qkxdawL{extensions}"
    first = dict(
        item.split("=", 1)
        for item in (await server.evaluate((gs2 + bare).encode())).decode().split(",")
    )
    salted = hashlib.pbkdf2_hmac(
        digest, b"alice-secret", base64.b64decode(first["s"]), int(first["i"])
    )
    client_key = hmac.digest(salted, b"Client Key", digest)
    without_proof = f"c={base64.b64encode(gs2.encode()).decode()},r={first['r']}"
    server_first = f"r={first['r']},s={first['s']},i={first['i']}"
    auth_message = f"{bare},{server_first},{without_proof}".encode()
    signature = hmac.digest(hashlib.sha256(client_key).digest(), auth_message, digest)
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    final = await server.evaluate(f"{without_proof},p={base64.b64encode(proof).decode()}".encode())
    server_key = hmac.digest(salted, b"Server Key", digest)
    assert final == b"v=" + base64.b64encode(hmac.digest(server_key, auth_message, digest))
    assert server.complete and server.principal == KafkaPrincipal("User", "alice")


async def test_scram_client_final_refused() -> None:
    server = ScramServer("SCRAM-SHA-256", lookup_of("SCRAM-SHA-256", USERS))
    client = scramp.ScramClient(["SCRAM-SHA-256"], "alice", "alice-secret")
    client.set_server_first((await server.evaluate(client.get_client_first().encode())).decode())
    final = client.get_client_final()
    tampered = final.replace(",r=", ",r=x")  # a nonce that is not the server's
    with pytest.raises(SaslAuthenticationError, match=f"^{failed('SCRAM-SHA-256')}$"):
        await server.evaluate(tampered.encode())
    with pytest.raises(IllegalSaslStateError):
        await server.evaluate(final.encode())


def test_scram_mechanisms_only() -> None:
    with pytest.raises(UnsupportedSaslMechanismError):
        ScramServer("SCRAM-SHA-1", lambda user: None)
    with pytest.raises(UnsupportedSaslMechanismError):
        salted_password("PLAIN", "x", SALT, 4096)


# --- OAUTHBEARER with unsecured tokens ----------------------------------------------------


def b64url(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def unsecured(claims: dict[str, Any], header: dict[str, Any] | None = None) -> str:
    return f"{b64url(header if header is not None else {'alg': 'none'})}.{b64url(claims)}."


def initial_response(token: str, authzid: str = "", **extensions: str) -> bytes:
    """The client's first message as Kafka's OAuthBearerClientInitialResponse writes it."""
    pairs = "".join(f"{k}={v}\x01" for k, v in extensions.items())
    a = f"a={authzid}" if authzid else ""
    return f"n,{a},\x01auth=Bearer {token}\x01{pairs}\x01".encode()


NOW = int(time.time())  # tokens checked against the clock are valid for an hour from it


async def test_oauthbearer() -> None:
    token = unsecured({"sub": "alice", "exp": NOW + 3600, "iat": NOW})
    server = OAuthBearerServer(UnsecuredJwsValidator({}))
    assert server.mechanism == "OAUTHBEARER"
    assert await server.evaluate(initial_response(token, "alice", traceId="t-1")) == b""
    assert server.complete
    assert server.principal == KafkaPrincipal("User", "alice")
    assert server.lifetime_ms == (NOW + 3600) * 1000
    assert server.extensions == {"traceId": "t-1"}
    with pytest.raises(IllegalSaslStateError):
        await server.evaluate(b"\x01")


async def test_oauthbearer_invalid_token_gets_kafka_json_challenge() -> None:
    token = unsecured({"sub": "alice", "exp": NOW - 60})
    server = OAuthBearerServer(UnsecuredJwsValidator({}))
    assert await server.evaluate(initial_response(token)) == b'{"status":"invalid_token"}'
    assert not server.complete
    with pytest.raises(SaslAuthenticationError, match=re.escape('{"status":"invalid_token"}')):
        await server.evaluate(b"\x01")
    with pytest.raises(IllegalSaslStateError):
        await server.evaluate(b"\x01")


async def test_oauthbearer_missing_scope() -> None:
    validator = UnsecuredJwsValidator({"unsecuredValidatorRequiredScope": "LOGIN_TO_KAFKA  b"})
    token = unsecured({"sub": "alice", "exp": NOW + 3600, "scope": ["LOGIN_TO_KAFKA"]})
    server = OAuthBearerServer(validator)
    challenge = await server.evaluate(initial_response(token))
    assert challenge == b'{"status":"insufficient_scope", "scope":"[LOGIN_TO_KAFKA, b]"}'
    with pytest.raises(SaslAuthenticationError):
        await server.evaluate(b"\x01")


async def test_oauthbearer_anything_but_ack_after_the_error() -> None:
    server = OAuthBearerServer(UnsecuredJwsValidator({}))
    await server.evaluate(initial_response("a.b.c"))
    with pytest.raises(IllegalSaslStateError):
        await server.evaluate(initial_response(unsecured({"sub": "a", "exp": NOW + 3600})))


async def test_oauthbearer_authzid_of_another_principal() -> None:
    token = unsecured({"sub": "alice", "exp": NOW + 3600})
    with pytest.raises(SaslAuthenticationError) as e:
        await OAuthBearerServer(UnsecuredJwsValidator({})).evaluate(initial_response(token, "bob"))
    assert str(e.value) == (
        "Authentication failed: Client requested an authorization id (bob) that is different "
        "from the token's principal name (alice)"
    )


@pytest.mark.parametrize(
    "response",
    [
        b"",
        b"n,,\x01auth=Bearer abc\x01",  # no closing ^A
        b"n,,\x01auth=Basic abc\x01\x01",
        b"n,,\x01auth=Bearer\x01\x01",
        b"n,,\x01auth=Bearer a b\x01\x01",
        b"n,,\x01\x01",  # no auth
        b"n,,\x01auth=Bearer abc\x01bad key=1\x01\x01",
        b"y,,\x01auth=Bearer abc\x01\x01",
        b"n,,\x01auth=Bearer \xc3\xa9\x01\x01",
    ],
)
async def test_oauthbearer_malformed_initial_response(response: bytes) -> None:
    with pytest.raises(SaslAuthenticationError, match=f"^{failed('OAUTHBEARER')}$"):
        await OAuthBearerServer(UnsecuredJwsValidator({})).evaluate(response)


async def test_oauthbearer_scheme_any_case() -> None:
    token = unsecured({"sub": "alice", "exp": NOW + 3600})
    server = OAuthBearerServer(UnsecuredJwsValidator({}))
    await server.evaluate(f"n,,\x01auth=bEaReR   {token}\x01\x01".encode())
    assert server.complete


async def test_oauthbearer_validator_crash_is_a_plain_failure() -> None:
    class Broken:
        async def validate(self, token: str) -> tuple[str, int]:
            raise RuntimeError("bug")

    with pytest.raises(SaslAuthenticationError, match=f"^{failed('OAUTHBEARER')}$"):
        await OAuthBearerServer(Broken()).evaluate(initial_response("a.b.c"))


MS = NOW * 1000


def refusal(validator: UnsecuredJwsValidator, token: str, now_ms: int = MS) -> str:
    with pytest.raises(OAuthBearerValidationError) as e:
        validator.check(token, now_ms)
    return str(e.value)


def test_unsecured_validator_checks_as_kafka() -> None:
    v = UnsecuredJwsValidator({})
    good = {"sub": "alice", "exp": NOW + 60}
    assert v.check(unsecured(good), MS) == ("alice", (NOW + 60) * 1000)
    assert v.check(unsecured({"sub": "a", "exp": NOW + 0.5}), MS) == ("a", MS + 500)
    assert "contains '..'" in refusal(v, "a..b")
    assert "3 dot-separated" in refusal(v, "a.b")
    assert "Base64" in refusal(v, "a!.b.")
    not_json = base64.urlsafe_b64encode(b"{not json").decode().rstrip("=")
    assert "malformed JSON" in refusal(v, f"{not_json}.{b64url(good)}.")
    assert "malformed JSON" in refusal(v, f"{base64.urlsafe_b64encode(b'[1]').decode()}.e30.")
    assert "Algorithm value" in refusal(v, unsecured(good, {"typ": "JWT"}))
    assert "'none' for an algorithm" in refusal(v, unsecured(good, {"alg": "HS256"}))
    assert "digital signature" in refusal(v, unsecured(good) + "sig")
    assert "No expiration time" in refusal(v, unsecured({"sub": "a"}))
    assert "'exp' claim was not of type Number" in refusal(v, unsecured({"sub": "a", "exp": "1"}))
    assert "not of type Number" in refusal(v, unsecured({"sub": "a", "exp": True}))
    assert "No principal name in JWT claim: sub" in refusal(v, unsecured({"exp": NOW + 60}))
    assert "No principal name" in refusal(v, unsecured({"sub": "  ", "exp": NOW + 60}))
    assert "not of type String" in refusal(v, unsecured({"sub": 7, "exp": NOW + 60}))
    assert "Expiration Time value" in refusal(v, unsecured({"sub": "a", "exp": NOW}))
    assert "Issued At value" in refusal(v, unsecured({**good, "iat": NOW + 1}))
    skewed = UnsecuredJwsValidator({"unsecuredValidatorAllowableClockSkewMs": "10000"})
    same = unsecured({"sub": "a", "exp": NOW + 5, "iat": NOW + 5})
    assert "not after the Issued At" in refusal(skewed, same)
    assert "'iat' claim was not of type Number" in refusal(v, unsecured({**good, "iat": "x"}))
    assert "'scope' claim was not of type List" in refusal(v, unsecured({**good, "scope": 3}))


def test_unsecured_validator_options() -> None:
    v = UnsecuredJwsValidator(
        {
            "unsecuredValidatorPrincipalClaimName": " principal ",
            "unsecuredValidatorScopeClaimName": "scp",
            "unsecuredValidatorRequiredScope": "x y",
            "unsecuredValidatorAllowableClockSkewMs": "3000",
        }
    )
    # 2 s either side is within the 3 s of skew allowed, 3 s is not
    claims = {"principal": "svc", "exp": NOW - 2, "iat": NOW - 10, "scp": ["y", " x "]}
    assert v.check(unsecured(claims), MS) == ("svc", (NOW - 2) * 1000)
    assert v.check(unsecured({**claims, "iat": NOW + 2, "exp": NOW + 9}), MS)[0] == "svc"
    assert "Expiration Time" in refusal(v, unsecured({**claims, "exp": NOW - 3}))
    assert "Issued At" in refusal(v, unsecured({**claims, "iat": NOW + 4, "exp": NOW + 9}))
    # a string scope claim is one value, not split at spaces (Kafka's reading)
    scope_refused = refusal(v, unsecured({**claims, "scp": "x y"}))
    assert "missing a required scope (x)" in scope_refused


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"unsecuredValidatorAllowableClockSkewMs": "soon"}, "AllowableClockSkewMs"),
        ({"unsecuredValidatorAllowableClockSkewMs": "-1"}, "must not be negative"),
        ({"unsecuredValidatorAllowableClockSkewMs": "99999999999"}, "AllowableClockSkewMs"),
        ({"unsecuredValidatorRequiredScope": 'a "b"'}, "Invalid scope value"),
    ],
)
def test_unsecured_validator_bad_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=f"^my.jaas.config: .*{message}"):
        UnsecuredJwsValidator(options, "my.jaas.config")


# --- OAUTHBEARER with a JWKS --------------------------------------------------------------


@dataclass
class JwksServer:
    """A JWKS endpoint on 127.0.0.1 whose key set a test changes as it goes."""

    url: str = ""
    keys: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0
    delay_s: float = 0.0


@pytest.fixture
def jwks() -> Iterator[JwksServer]:
    state = JwksServer()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.requests += 1
            time.sleep(state.delay_s)
            body = json.dumps({"keys": state.keys}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@dataclass
class SigningKey:
    kid: str
    alg: str
    private: Any

    @property
    def jwk(self) -> dict[str, Any]:
        algorithm = jwt.get_algorithm_by_name(self.alg)
        public = json.loads(algorithm.to_jwk(self.private.public_key()))
        return {**public, "kid": self.kid, "use": "sig"}

    def sign(self, claims: dict[str, Any], kid: str | None = None, **header: Any) -> str:
        return jwt.encode(
            claims, self.private, self.alg, headers={"kid": kid or self.kid, **header}
        )


def rsa_key(kid: str) -> SigningKey:
    return SigningKey(kid, "RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048))


@pytest.fixture(scope="module")
def rsa1() -> SigningKey:
    return rsa_key("rsa-1")


@pytest.fixture(scope="module")
def rsa2() -> SigningKey:
    return rsa_key("rsa-2")


def claims(**extra: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"sub": "alice", "iat": now, "exp": now + 300, **extra}


async def refused(validator: JwksValidator, token: str) -> str:
    with pytest.raises(OAuthBearerValidationError) as e:
        await validator.validate(token)
    return str(e.value).lower()


async def test_jwks_rs256_and_es256(jwks: JwksServer, rsa1: SigningKey) -> None:
    es = SigningKey("ec-1", "ES256", ec.generate_private_key(ec.SECP256R1()))
    jwks.keys = [rsa1.jwk, es.jwk]
    validator = JwksValidator(jwks.url, 3_600_000, None, None)
    c = claims()
    assert await validator.validate(rsa1.sign(c)) == ("alice", c["exp"] * 1000)
    bob = claims(sub="bob")  # its own expiry: a second may have turned since c's
    assert await validator.validate(es.sign(bob)) == ("bob", bob["exp"] * 1000)
    assert jwks.requests == 1  # the key set is cached


async def test_jwks_refusals(jwks: JwksServer, rsa1: SigningKey, rsa2: SigningKey) -> None:
    jwks.keys = [rsa1.jwk]
    v = JwksValidator(jwks.url, 3_600_000, None, None, clock_skew_s=0)
    now = int(time.time())
    assert "bad signature" in await refused(v, rsa2.sign(claims(), kid="rsa-1"))
    assert "expired" in await refused(v, rsa1.sign(claims(exp=now - 5)))
    assert "iat" in await refused(v, rsa1.sign({"sub": "a", "exp": now + 60}))
    assert "exp" in await refused(v, rsa1.sign({"sub": "a", "iat": now}))
    assert "'sub' claim" in await refused(v, rsa1.sign(claims(sub=" ")))
    assert "'sub' claim" in await refused(v, rsa1.sign({"iat": now, "exp": now + 60}))
    # an audience in a token when none is expected is refused, as jose4j refuses it
    assert "audience" in await refused(v, rsa1.sign(claims(aud="kafka")))
    assert "malformed" in await refused(v, "not-a-jwt")
    unsigned = jwt.encode(claims(), "", "none", headers={"kid": "rsa-1"})
    assert "'none' is not accepted" in await refused(v, unsigned)
    hmac_token = jwt.encode(claims(), "s" * 32, "HS256", headers={"kid": "rsa-1"})
    assert "'hs256' is not accepted" in await refused(v, hmac_token)


async def test_jwks_audience_issuer_and_skew(jwks: JwksServer, rsa1: SigningKey) -> None:
    jwks.keys = [rsa1.jwk]
    v = JwksValidator(jwks.url, 3_600_000, ["kafka", "other"], "https://idp", sub_claim="client_id")
    now = int(time.time())
    good = claims(aud=["x", "kafka"], iss="https://idp", client_id="svc", exp=now - 10)
    assert (await v.validate(rsa1.sign(good)))[0] == "svc"  # 10 s late, within 30 s of skew
    assert "audience" in await refused(v, rsa1.sign({**good, "aud": "x"}))
    assert "aud" in await refused(v, rsa1.sign({k: g for k, g in good.items() if k != "aud"}))
    assert "issuer" in await refused(v, rsa1.sign({**good, "iss": "https://evil"}))
    assert "iss" in await refused(v, rsa1.sign({k: g for k, g in good.items() if k != "iss"}))


async def test_jwks_unknown_kid_fetches_again_once_per_interval(
    jwks: JwksServer, rsa1: SigningKey, rsa2: SigningKey
) -> None:
    jwks.keys = [rsa1.jwk]
    v = JwksValidator(jwks.url, 3_600_000)
    await v.validate(rsa1.sign(claims()))
    assert jwks.requests == 1
    jwks.keys = [rsa1.jwk, rsa2.jwk]  # the provider rotates in a new key
    assert (await v.validate(rsa2.sign(claims())))[0] == "alice"
    assert jwks.requests == 2
    # a key id nobody has: no fetch again within the interval
    assert "no key" in await refused(v, rsa2.sign(claims(), kid="nobody"))
    assert "no key" in await refused(v, rsa2.sign(claims(), kid="nobody-else"))
    assert jwks.requests == 2


async def test_jwks_first_fetch_finds_no_key_and_does_not_fetch_twice(
    jwks: JwksServer, rsa1: SigningKey
) -> None:
    jwks.keys = []
    v = JwksValidator(jwks.url, 3_600_000)
    assert "no key" in await refused(v, rsa1.sign(claims()))
    assert jwks.requests == 1


async def test_jwks_token_without_kid(jwks: JwksServer, rsa1: SigningKey, rsa2: SigningKey) -> None:
    jwks.keys = [rsa2.jwk, rsa1.jwk]
    token = jwt.encode(claims(), rsa1.private, "RS256")  # no kid: every RSA key is tried
    assert (await JwksValidator(jwks.url, 3_600_000).validate(token))[0] == "alice"


async def test_jwks_refreshed_when_old_and_kept_when_the_fetch_fails(
    jwks: JwksServer, rsa1: SigningKey
) -> None:
    jwks.keys = [rsa1.jwk]
    v = JwksValidator(jwks.url, 0)  # always old
    await v.validate(rsa1.sign(claims()))
    await v.validate(rsa1.sign(claims()))
    assert jwks.requests == 2 and v.fetches == 2
    jwks.keys = [{"kty": "RSA"}]  # unusable: no key fits any more
    assert "no key" in await refused(v, rsa1.sign(claims()))


async def test_jwks_endpoint_down(rsa1: SigningKey) -> None:
    v = JwksValidator("http://127.0.0.1:9/jwks", 3_600_000, fetch_timeout_s=2)
    assert "could not be fetched" in await refused(v, rsa1.sign(claims()))


async def test_jwks_cached_keys_outlive_the_endpoint(jwks: JwksServer, rsa1: SigningKey) -> None:
    jwks.keys = [rsa1.jwk]
    url = jwks.url
    v = JwksValidator(url, 0, fetch_timeout_s=2)
    await v.validate(rsa1.sign(claims()))
    v.jwks_url = "http://127.0.0.1:9/jwks"  # the provider goes away
    assert (await v.validate(rsa1.sign(claims())))[0] == "alice"


async def test_jwks_fetch_does_not_block_the_loop(jwks: JwksServer, rsa1: SigningKey) -> None:
    jwks.keys = [rsa1.jwk]
    jwks.delay_s = 0.3
    v = JwksValidator(jwks.url, 3_600_000)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        # three logins at once share one fetch, and the loop runs meanwhile
        results = await asyncio.gather(*(v.validate(rsa1.sign(claims())) for _ in range(3)))
    finally:
        task.cancel()
    assert [r[0] for r in results] == ["alice"] * 3
    assert jwks.requests == 1
    assert ticks >= 10


async def test_oauthbearer_with_jwks(jwks: JwksServer, rsa1: SigningKey, rsa2: SigningKey) -> None:
    jwks.keys = [rsa1.jwk]
    v = JwksValidator(jwks.url, 3_600_000)
    server: SaslMechanismServer = OAuthBearerServer(v)
    c = claims()
    assert await server.evaluate(initial_response(rsa1.sign(c))) == b""
    assert server.principal == KafkaPrincipal("User", "alice")
    assert server.lifetime_ms == c["exp"] * 1000
    server = OAuthBearerServer(v)
    bad = rsa2.sign(c, kid="rsa-1")
    assert await server.evaluate(initial_response(bad)) == b'{"status":"invalid_token"}'
    with pytest.raises(SaslAuthenticationError):
        await server.evaluate(b"\x01")


@pytest.mark.parametrize(
    ("kwargs", "prop"),
    [
        ({"jwks_url": "ftp://idp/jwks"}, "sasl.oauthbearer.jwks.endpoint.url"),
        ({"jwks_url": "idp/jwks"}, "sasl.oauthbearer.jwks.endpoint.url"),
        ({"refresh_ms": -1}, "sasl.oauthbearer.jwks.endpoint.refresh.ms"),
        ({"clock_skew_s": -1}, "sasl.oauthbearer.clock.skew.seconds"),
        ({"sub_claim": " "}, "sasl.oauthbearer.sub.claim.name"),
        ({"scope_claim": ""}, "sasl.oauthbearer.scope.claim.name"),
    ],
)
def test_jwks_configuration_errors(kwargs: dict[str, Any], prop: str) -> None:
    args: dict[str, Any] = {"jwks_url": "https://idp/jwks", "refresh_ms": 1000, **kwargs}
    with pytest.raises(ConfigError, match=f"^{re.escape(prop)}: "):
        JwksValidator(**args)


# --- fuzzing: anything a client sends fails cleanly -------------------------------------


def new_servers() -> list[SaslMechanismServer]:
    return [
        PlainServer({"alice": "a-long-password-no-fuzzer-finds"}),
        ScramServer("SCRAM-SHA-256", lookup_of("SCRAM-SHA-256", {"alice": "pw-" * 8})),
        ScramServer("SCRAM-SHA-512", lambda user: None),
        OAuthBearerServer(UnsecuredJwsValidator({"unsecuredValidatorRequiredScope": "s"})),
    ]


async def feed(server: SaslMechanismServer, tokens: list[bytes]) -> None:
    for token in tokens:
        try:
            challenge = await server.evaluate(token)
        except SASL_ERRORS:
            pass
        else:
            assert isinstance(challenge, bytes)
        assert not server.complete
        assert server.principal is None


_SCRAM_FIRST = st.builds(
    lambda user, nonce, tail: b"n,,n=" + user + b",r=" + nonce + tail,
    st.sampled_from([b"alice", b"bob", b"a=2Cb"]),
    st.one_of(
        st.binary(min_size=1, max_size=12),
        # a nonce scramp takes, so the fuzz goes on to the client-final message
        st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters=","))
        .filter(bool)
        .map(str.encode),
    ),
    st.one_of(st.just(b""), st.binary(max_size=12)),
)
_OAUTH_FIRST = st.builds(
    lambda token: initial_response(token),
    st.one_of(
        st.text("abcdefghijklmnopqrstuvwxyzABC0123456789-_.", min_size=1, max_size=60),
        st.builds(
            unsecured,
            st.dictionaries(
                st.sampled_from(["sub", "exp", "iat", "scope"]),
                st.one_of(st.integers(), st.floats(allow_nan=False), st.text(), st.booleans()),
            ),
        ),
    ),
)
_TOKENS = st.lists(
    st.one_of(
        st.binary(max_size=80), _SCRAM_FIRST, _OAUTH_FIRST, st.just(b"\x01"), st.just(b"\0a\0b")
    ),
    min_size=1,
    max_size=4,
)


@given(_TOKENS)
def test_any_tokens_only_fail_cleanly(tokens: list[bytes]) -> None:
    async def run() -> None:
        for server in new_servers():
            await feed(server, tokens)

    asyncio.run(run())
