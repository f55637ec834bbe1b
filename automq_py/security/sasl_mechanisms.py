"""The server side of each SASL mechanism, as Kafka's ``SaslServer`` implementations answer a
client: tokens in, challenges out, a principal once the exchange completes.

Each mechanism is a small state machine behind :class:`SaslMechanismServer` with no I/O of its
own (OAUTHBEARER's JWKS validator fetches keys off the event loop): the authenticator feeds it
the client's SaslAuthenticate tokens and sends back what it returns.

=============  ===============================================================================
mechanism      exchange (client -> server)
=============  ===============================================================================
PLAIN          ``[authzid] NUL user NUL password`` -> ``""``                   (RFC 4616)
SCRAM-SHA-*    client-first -> server-first; client-final -> ``v=<signature>`` (RFC 5802)
OAUTHBEARER    ``n,[a=authzid],^Aauth=Bearer <jwt>^A[key=value^A]*^A`` -> ``""``; a token
               refused is answered ``{"status":"invalid_token"}`` and the client's ``^A``
               then fails the exchange                                         (RFC 7628)
=============  ===============================================================================

Failures raise the errors of :mod:`automq_py.security.errors` with the message the client is
told, Kafka's words: a malformed message or refused SCRAM proof is "Authentication failed
during authentication due to invalid credentials with SASL mechanism <name>", which never says
whether the user exists; a SCRAM user that does not exist goes through the same exchange with
a fake credential, so neither the messages nor the steps tell it apart from a wrong password.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import logging
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import scramp

from automq_py.security.errors import (
    IllegalSaslStateError,
    SaslAuthenticationError,
    UnsupportedSaslMechanismError,
)
from automq_py.security.oauthbearer import (
    JwksValidator,
    OAuthBearerValidationError,
    OAuthBearerValidator,
    UnsecuredJwsValidator,
)
from automq_py.security.principal import USER_TYPE, KafkaPrincipal

__all__ = [
    "MECHANISMS",
    "SCRAM_MAX_ITERATIONS",
    "SCRAM_MECHANISMS",
    "SCRAM_MIN_ITERATIONS",
    "JwksValidator",
    "OAuthBearerServer",
    "OAuthBearerValidationError",
    "OAuthBearerValidator",
    "PlainServer",
    "SaslMechanismServer",
    "ScramCredential",
    "ScramServer",
    "UnsecuredJwsValidator",
    "authentication_failed",
    "salted_password",
    "scram_credential",
]

log = logging.getLogger("automq.security.sasl")

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
# Kafka's ScramMechanism bounds: fewer is refused at login, more by AlterUserScramCredentials
SCRAM_MIN_ITERATIONS = 4096
SCRAM_MAX_ITERATIONS = 16384
_SCRAM_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


class SaslMechanismServer(Protocol):
    """One client's exchange of one mechanism."""

    mechanism: str
    complete: bool
    principal: KafkaPrincipal | None  # set once complete
    # when the credential itself expires (epoch ms: an OAUTHBEARER token's exp), else None
    lifetime_ms: int | None

    async def evaluate(self, response: bytes) -> bytes:
        """The client's next token in, the server's challenge out (``b""`` when none)."""
        ...


def authentication_failed(mechanism: str) -> SaslAuthenticationError:
    """Kafka's answer to a refused exchange that must not say why."""
    return SaslAuthenticationError(
        "Authentication failed during authentication due to invalid credentials with SASL "
        f"mechanism {mechanism}"
    )


class _State(enum.Enum):
    FIRST = "first message"
    FINAL = "final message"
    ERROR_SENT = "error sent"
    COMPLETE = "complete"
    FAILED = "failed"


def _out_of_turn(mechanism: str, state: _State) -> IllegalSaslStateError:
    return IllegalSaslStateError(f"Unexpected SASL/{mechanism} message in state {state.value}")


# --- PLAIN -------------------------------------------------------------------------------

_DIFFERENT_AUTHZID = (
    "Authentication failed: Client requested an authorization id that is different from username"
)
# what an unknown user's password is compared with, so that the compare takes place anyway
_NO_PASSWORD = secrets.token_bytes(32)


class PlainServer:
    """SASL/PLAIN against a fixed table of users and passwords (PlainLoginModule's
    ``user_<name>`` options)."""

    mechanism = "PLAIN"

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = {name: password.encode() for name, password in users.items()}
        self.complete = False
        self.principal: KafkaPrincipal | None = None
        self.lifetime_ms: int | None = None
        self._state = _State.FIRST

    async def evaluate(self, response: bytes) -> bytes:
        """Check ``[authzid] NUL user NUL password``; done in one step."""
        if self._state is not _State.FIRST:
            raise _out_of_turn(self.mechanism, self._state)
        self._state = _State.FAILED
        # RFC 4616 has exactly two NULs; Kafka's extractTokens counts up to four tokens, and
        # says what is wrong: none of it tells whether a user exists
        parts = response.split(b"\0", 3)
        if len(parts) != 3:
            raise SaslAuthenticationError(
                f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}"
            )
        authzid_raw, user_raw, password = parts
        if not user_raw:
            raise SaslAuthenticationError("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationError("Authentication failed: password not specified")
        try:
            user = user_raw.decode()
            authzid = authzid_raw.decode()
        except UnicodeDecodeError:
            user, authzid = "", ""
        expected = self._users.get(user) if user else None
        # compared whether or not the user exists: the time taken does not tell
        matches = hmac.compare_digest(password, expected if expected is not None else _NO_PASSWORD)
        if expected is None or not matches:
            raise SaslAuthenticationError("Authentication failed: Invalid username or password")
        if authzid and authzid != user:
            raise SaslAuthenticationError(_DIFFERENT_AUTHZID)
        self.principal = KafkaPrincipal(USER_TYPE, user)
        self.complete = True
        self._state = _State.COMPLETE
        return b""


# --- SCRAM -------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class ScramCredential:
    """What a broker keeps of a SCRAM password (RFC 5802): never the password itself."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __repr__(self) -> str:
        return f"ScramCredential(salt=[hidden], keys=[hidden], iterations={self.iterations})"


def _hash_name(mechanism: str) -> str:
    try:
        return _SCRAM_HASHES[mechanism]
    except KeyError:
        raise UnsupportedSaslMechanismError(f"Unsupported SASL mechanism {mechanism}") from None


def scram_credential(
    mechanism: str, salted_password: bytes, salt: bytes, iterations: int
) -> ScramCredential:
    """The credential an AlterUserScramCredentials upsertion stores: its StoredKey and
    ServerKey derived from the salted password the client sent (which is then dropped)."""
    digest = _hash_name(mechanism)
    client_key = hmac.digest(salted_password, b"Client Key", digest)
    stored_key = hashlib.new(digest, client_key).digest()
    server_key = hmac.digest(salted_password, b"Server Key", digest)
    return ScramCredential(bytes(salt), stored_key, server_key, iterations)


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """``Hi(password, salt, i)`` (PBKDF2) as Kafka's ScramFormatter computes it: the password's
    UTF-8 bytes, not SASLprep'd."""
    return hashlib.pbkdf2_hmac(_hash_name(mechanism), password.encode(), salt, iterations)


# Kafka's ScramMessages grammar, on bytes (every character it allows is ASCII)
_SASLNAME = rb"(?:[\x01-\x2b\x2d-\x3c\x3e-\x7f]|=2C|=3D)+"
_VALUE = rb"[\x01-\x2b\x2d-\x7f]+"
_PRINTABLE = rb"[\x21-\x2b\x2d-\x7e]+"
_CLIENT_FIRST = re.compile(
    rb"n,(?:a=(?P<authzid>%s))?,(?P<bare>(?:m=%s,)?n=(?P<saslname>%s),r=%s"
    rb"(?P<extensions>(?:,[A-Za-z]+=%s)*))" % (_SASLNAME, _VALUE, _SASLNAME, _PRINTABLE, _VALUE)
)
_CLIENT_FINAL = re.compile(
    rb"(?P<bare>c=(?P<cbind>[A-Za-z0-9+/=]*),r=(?P<nonce>%s)(?:,[A-Za-z]+=%s)*),p=(?P<proof>[A-Za-z0-9+/=]+)"
    % (_PRINTABLE, _VALUE)
)
# a secret of this process: fake credentials are the same for a user on every attempt
_FAKE_SECRET = secrets.token_bytes(32)


def _base36(number: int) -> str:
    digits = []
    while number:
        number, d = divmod(number, 36)
        digits.append("0123456789abcdefghijklmnopqrstuvwxyz"[d])
    return "".join(reversed(digits)) or "0"


def _fake_credential(mechanism: str, user: str, iterations: int) -> ScramCredential:
    """A credential no password matches, stable per user, shaped like Kafka's (the salt a
    base-36 number of 130 random bits, as ScramFormatter.secureRandomBytes makes them)."""
    digest = _hash_name(mechanism)
    seed = f"{mechanism}\0{user}".encode()
    number = int.from_bytes(hmac.digest(_FAKE_SECRET, b"salt\0" + seed, "sha256"), "big") >> 126
    salt = _base36(number).rjust(12, "0").encode()
    stored_key = hmac.digest(_FAKE_SECRET, b"stored\0" + seed, digest)
    server_key = hmac.digest(_FAKE_SECRET, b"server\0" + seed, digest)
    return ScramCredential(salt, stored_key, server_key, iterations)


class ScramServer:
    """SASL/SCRAM-SHA-256 or -512 (RFC 5802, no channel binding) with scramp's server, against
    the credentials ``lookup`` finds by user name.

    As Kafka: the user name is the SASLname of the client-first message, ``=2C`` and ``=3D``
    decoded; an authzid must equal it. Kafka's ``tokenauth`` extension (delegation tokens) and
    other extensions are refused. Unlike Kafka a user that does not exist, or whose stored
    credential has too few iterations, is not refused at once: the exchange goes on with a fake
    credential and fails at the proof, as a wrong password does.
    """

    def __init__(
        self,
        mechanism: str,
        lookup: Callable[[str], ScramCredential | None],
        *,
        fake_iterations: int = SCRAM_MIN_ITERATIONS,
    ) -> None:
        if mechanism not in SCRAM_MECHANISMS:
            raise UnsupportedSaslMechanismError(f"Unsupported SASL mechanism {mechanism}")
        self.mechanism = mechanism
        self.complete = False
        self.principal: KafkaPrincipal | None = None
        self.lifetime_ms: int | None = None
        self._lookup = lookup
        self._fake_iterations = fake_iterations
        self._state = _State.FIRST
        self._server: scramp.core.ScramServer | None = None
        self._user = ""
        self._genuine = False
        # what the proof is computed over, and the credential it is checked against
        self._gs2_header = b""
        self._client_first_bare = b""
        self._server_first = b""
        self._server_nonce = b""
        self._credential_used: ScramCredential | None = None

    async def evaluate(self, response: bytes) -> bytes:
        """client-first -> server-first, then client-final -> server-final."""
        state = self._state
        if state not in (_State.FIRST, _State.FINAL):
            raise _out_of_turn(self.mechanism, state)
        self._state = _State.FAILED
        try:
            if state is _State.FIRST:
                challenge = self._client_first(response)
                self._state = _State.FINAL
            else:
                challenge = self._client_final(response)
                self._state = _State.COMPLETE
        finally:
            if self._state is _State.FAILED:
                self._server = None
        return challenge

    def _client_first(self, response: bytes) -> bytes:
        m = _CLIENT_FIRST.fullmatch(response)
        if m is None:
            log.info("SASL/%s: malformed client-first message %r", self.mechanism, response[:200])
            raise authentication_failed(self.mechanism)
        user = m.group("saslname").decode("ascii").replace("=2C", ",").replace("=3D", "=")
        extensions = m.group("extensions")
        if extensions:
            # Kafka ignores the extensions it does not know; tokenauth asks for a delegation
            # token's credential, which this broker issues none of (Kafka's lookup finds none)
            named = dict(item.partition(b"=")[::2] for item in extensions[1:].split(b","))
            if named.get(b"tokenauth", b"").lower() == b"true":
                log.info("SASL/%s: a delegation token asked for: none here", self.mechanism)
                raise authentication_failed(self.mechanism)
            log.debug("SASL/%s: extensions ignored: %r", self.mechanism, extensions)
        credential = self._credential(user)
        authzid = m.group("authzid")
        # Kafka compares the authzid as sent with the decoded user name, once the user is found
        # (an unknown user's exchange fails as any other)
        if authzid is not None and authzid.decode("ascii") != user:
            if not self._genuine:
                raise authentication_failed(self.mechanism)
            raise SaslAuthenticationError(_DIFFERENT_AUTHZID)
        self._user = user

        def credentials(_saslprepped: str) -> tuple[bytes, bytes, bytes, int]:
            return (
                credential.salt,
                credential.stored_key,
                credential.server_key,
                credential.iterations,
            )

        try:
            # a server nonce shaped as Kafka's (130 random bits in base 36): scramp's own is 64
            # hex digits, and librdkafka before 2.1 sends a longer nonce back cut short
            server = scramp.ScramMechanism(self.mechanism).make_server(
                credentials, s_nonce=_base36(secrets.randbits(130))
            )
            # scramp takes neither an authzid (the user's own name here) nor extensions: it
            # reads the message without them, and the proof is checked over it as sent
            bare = response[m.start("bare") : m.start("extensions")]
            server.set_client_first("n,," + bare.decode("ascii"))
            challenge: str = server.get_server_first()
        except scramp.ScramException as e:
            log.info("SASL/%s: client-first refused: %s", self.mechanism, e)
            raise authentication_failed(self.mechanism) from None
        self._server = server
        self._gs2_header = response[: m.start("bare")]
        self._client_first_bare = response[m.start("bare") :]
        self._server_first = challenge.encode("ascii")
        self._server_nonce = str(server.nonce).encode("ascii")  # the client's part and ours
        self._credential_used = credential
        return self._server_first

    def _credential(self, user: str) -> ScramCredential:
        try:
            credential = self._lookup(user)
        except Exception as e:
            # Kafka: "Credentials could not be obtained", told to the client as a failure
            log.warning("SASL/%s: credential lookup failed: %r", self.mechanism, e)
            raise authentication_failed(self.mechanism) from None
        if credential is not None and credential.iterations >= SCRAM_MIN_ITERATIONS:
            self._genuine = True
            return credential
        if credential is not None:
            log.warning(
                "SASL/%s: the credential has %d iterations, fewer than %d: refused",
                self.mechanism,
                credential.iterations,
                SCRAM_MIN_ITERATIONS,
            )
        return _fake_credential(self.mechanism, user, self._fake_iterations)

    def _client_final(self, response: bytes) -> bytes:
        """Check the proof, as Kafka's ScramSaslServer does: the nonce must *end with* the
        server's (librdkafka before 2.1 sends the client's part twice, and Kafka takes it), and
        the proof is over the messages as sent. (scramp asks for an equal nonce, so this step is
        its arithmetic, not its call.)"""
        server = self._server
        assert server is not None
        m = _CLIENT_FINAL.fullmatch(response)
        if m is None or m.group("cbind") != base64.b64encode(self._gs2_header):
            log.info("SASL/%s: malformed client-final message", self.mechanism)
            raise authentication_failed(self.mechanism)
        if not m.group("nonce").endswith(self._server_nonce):
            log.info("SASL/%s: client-final nonce does not end with the server's", self.mechanism)
            raise authentication_failed(self.mechanism)
        credential = self._credential_used
        assert credential is not None
        digest = _hash_name(self.mechanism)
        auth_message = b",".join((self._client_first_bare, self._server_first, m.group("bare")))
        try:
            proof = base64.b64decode(m.group("proof"), validate=True)
        except ValueError:
            raise authentication_failed(self.mechanism) from None
        signature = hmac.digest(credential.stored_key, auth_message, digest)
        if len(proof) != len(signature):
            raise authentication_failed(self.mechanism)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        genuine = self._genuine
        if not hmac.compare_digest(hashlib.new(digest, client_key).digest(), credential.stored_key):
            raise authentication_failed(self.mechanism)
        if not genuine:
            raise authentication_failed(self.mechanism)  # no proof matches a fake credential
        self._server = None
        self.principal = KafkaPrincipal(USER_TYPE, self._user)
        self.complete = True
        server_signature = hmac.digest(credential.server_key, auth_message, digest)
        return b"v=" + base64.b64encode(server_signature)


# --- OAUTHBEARER -------------------------------------------------------------------------

# Kafka's OAuthBearerClientInitialResponse grammar, on bytes
_OAUTH_INITIAL = re.compile(
    rb"n,(?:a=(?P<authzid>%s))?,\x01(?P<kvpairs>(?:[A-Za-z]+=[\x21-\x7e \t\r\n]+\x01)*)\x01"
    % _SASLNAME
)
_OAUTH_AUTH = re.compile(rb"(?P<scheme>[A-Za-z0-9_]+) +(?P<token>[-_.a-zA-Z0-9]+)")
_CONTROL_A = b"\x01"


class OAuthBearerServer:
    """SASL/OAUTHBEARER (RFC 7628) as Kafka's OAuthBearerSaslServer: the bearer token is
    checked by ``validator``; a token it refuses is answered with the JSON error Kafka sends,
    and the client's ``^A`` acknowledgement then fails the exchange with that JSON as the
    message. Extensions (``key=value`` pairs besides ``auth``) are all accepted, as Kafka's
    validator callback handlers accept them, and kept in :attr:`extensions`."""

    mechanism = "OAUTHBEARER"

    def __init__(self, validator: OAuthBearerValidator) -> None:
        self._validator = validator
        self.complete = False
        self.principal: KafkaPrincipal | None = None
        self.lifetime_ms: int | None = None
        self.extensions: dict[str, str] = {}
        self._state = _State.FIRST
        self._error = ""

    async def evaluate(self, response: bytes) -> bytes:
        """The client's initial response -> ``b""``, or the JSON error challenge."""
        state = self._state
        if state not in (_State.FIRST, _State.ERROR_SENT):
            raise _out_of_turn(self.mechanism, state)
        self._state = _State.FAILED
        if state is _State.ERROR_SENT:
            if response == _CONTROL_A:
                raise SaslAuthenticationError(self._error)
            raise _out_of_turn(self.mechanism, state)
        token, authzid, extensions = self._initial_response(response)
        try:
            principal, expiry_ms = await self._validator.validate(token)
        except OAuthBearerValidationError as e:
            return self._refuse(e, e.scope)
        except SaslAuthenticationError as e:
            return self._refuse(e, None)
        except Exception as e:
            # Kafka: "Authentication could not be performed due to an internal error on the
            # server", told to the client as a failure
            log.warning("SASL/OAUTHBEARER: token validation failed: %r", e)
            raise authentication_failed(self.mechanism) from None
        if authzid and authzid != principal:
            raise SaslAuthenticationError(
                f"Authentication failed: Client requested an authorization id ({authzid}) that "
                f"is different from the token's principal name ({principal})"
            )
        self.principal = KafkaPrincipal(USER_TYPE, principal)
        self.lifetime_ms = expiry_ms
        self.extensions = extensions
        self.complete = True
        self._state = _State.COMPLETE
        return b""

    def _initial_response(self, response: bytes) -> tuple[str, str, dict[str, str]]:
        m = _OAUTH_INITIAL.fullmatch(response)
        if m is None:
            raise authentication_failed(self.mechanism)
        pairs: dict[str, str] = {}
        for pair in m.group("kvpairs").split(_CONTROL_A)[:-1]:
            key, _, value = pair.decode("ascii").partition("=")
            pairs[key] = value
        auth = _OAUTH_AUTH.fullmatch(pairs.pop("auth", "").encode("ascii"))
        if auth is None or auth.group("scheme").lower() != b"bearer":
            raise authentication_failed(self.mechanism)
        authzid = m.group("authzid")
        return (
            auth.group("token").decode("ascii"),
            authzid.decode("ascii") if authzid is not None else "",
            pairs,
        )

    def _refuse(self, error: SaslAuthenticationError, scope: str | None) -> bytes:
        log.info("SASL/OAUTHBEARER: token refused: %s", error)
        # Kafka's jsonErrorResponse, to the byte (a scope as the string Kafka prints)
        if scope is None:
            body = '{"status":"invalid_token"}'
        else:
            body = f'{{"status":"insufficient_scope", "scope":{json.dumps(scope)}}}'
        self._error = body
        self._state = _State.ERROR_SENT
        return body.encode()
