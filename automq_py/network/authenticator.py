"""SaslAuthenticator: one connection's SASL exchange on a SASL listener, as Kafka's
``SaslServerAuthenticator`` runs it.

A client may send ApiVersions, then SaslHandshake naming its mechanism. After a v1 handshake
the mechanism's tokens come in SaslAuthenticate requests; after a v0 handshake (clients older
than Kafka 1.0) they come as bare size-prefixed frames, answered the same way. Any other request
before the exchange completes closes the connection, as does a refused exchange: its answer
(SASL_AUTHENTICATION_FAILED, with a message that never tells whether the user exists) is sent
after ``connection.failed.authentication.delay.ms``.

Once authenticated, the session lasts ``connections.max.reauth.ms`` (KIP-368; or less, if the
credential expires first: an OAUTHBEARER token), as the last SaslAuthenticate response tells
the client. The client re-authenticates on the same connection with a new SaslHandshake
before then; neither the mechanism nor the principal may change. A request other than
SaslAuthenticate while one is under way is answered ILLEGAL_SASL_STATE, after the failure's
delay, and the connection closes. A request on an expired session closes it. As in
Kafka's KafkaChannel, a SaslHandshake on a session that does not expire, or within a second of
the last re-authentication's start, is no re-authentication: the broker answers it (and any
SaslAuthenticate after it) ILLEGAL_SASL_STATE, keeping the connection.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from automq_py.apis.context import respond
from automq_py.security.errors import (
    IllegalSaslStateError,
    SaslAuthenticationError,
    UnsupportedSaslMechanismError,
)
from automq_py.security.sasl_mechanisms import SaslMechanismServer
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request

log = logging.getLogger("automq.network.sasl")

MechanismFactory = Callable[[str], SaslMechanismServer]
# a connection re-authenticates at most once in this long (Kafka's
# MIN_REAUTH_INTERVAL_ONE_SECOND_NANOS)
REAUTH_MIN_S = 1.0


class State(enum.Enum):
    HANDSHAKE_OR_VERSIONS = 1  # nothing yet: ApiVersions or SaslHandshake
    HANDSHAKE = 2  # ApiVersions answered: SaslHandshake
    AUTHENTICATE = 3  # SaslAuthenticate requests carry the tokens
    RAW_TOKENS = 4  # after a v0 handshake: bare tokens
    AUTHENTICATED = 5
    FAILED = 6
    # a re-authentication's handshake named another mechanism: the next request fails it
    REAUTH_BAD_MECHANISM = 7


@dataclass(slots=True)
class Outcome:
    """What answering one SASL message came to: the response (a kio entity, bare token
    bytes after a v0 handshake, or None: no answer), whether the connection closes after it,
    and how long the answer waits first (a refused exchange). ``refusal``: instead of a
    response, the request's own error response, with this error and message."""

    response: Any
    close: bool = False
    delay_s: float = 0.0
    refusal: tuple[ErrorCode, str] | None = None


class SaslAuthenticator:
    def __init__(
        self,
        mechanisms: tuple[str, ...],
        new_server: MechanismFactory,
        *,
        max_reauth_ms: int,
        failed_delay_ms: int,
        max_reauth_ms_by_mechanism: Mapping[str, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``max_reauth_ms``: the broker's connections.max.reauth.ms; a mechanism's own, where
        the listener sets one (Kafka's createConnectionsMaxReauthMsMap), in
        ``max_reauth_ms_by_mechanism``."""
        self.mechanisms = mechanisms
        self._new_server = new_server
        self._default_max_reauth_ms = max_reauth_ms
        self._max_reauth_ms_by = dict(max_reauth_ms_by_mechanism or {})
        self._failed_delay_s = failed_delay_ms / 1000
        self._clock = clock
        self.state = State.HANDSHAKE_OR_VERSIONS
        self._server: SaslMechanismServer | None = None
        self._mechanism: str | None = None
        self.principal: str | None = None  # once authenticated
        self._expires_at: float | None = None
        self._credential_lifetime_ms: int | None = None  # when the credential expires (epoch ms)
        self._reauthenticating = False
        self._reauth_started: float | None = None  # the clock at the last one's start
        self._bad_mechanism = ""  # why a re-authentication's handshake failed it

    @property
    def authenticated(self) -> bool:
        """Whether the connection may send other requests (during a re-authentication too:
        the old session holds until it expires)."""
        return self.principal is not None

    @property
    def raw_tokens(self) -> bool:
        """Whether the next frames are bare tokens (after a v0 handshake)."""
        return self.state is State.RAW_TOKENS

    def expired(self) -> bool:
        """Whether the session has outlived its lifetime (the connection must close)."""
        return self._expires_at is not None and self._clock() >= self._expires_at

    def intercepts(self, request: Request) -> bool:
        """Whether ``request`` is part of the exchange (this answers it), rather than a
        request for the broker."""
        if self.state is State.AUTHENTICATED:
            return request.api_key == ApiKey.SASL_HANDSHAKE and self._may_reauthenticate()
        if self.state is State.HANDSHAKE_OR_VERSIONS and request.api_key == ApiKey.API_VERSIONS:
            self.state = State.HANDSHAKE
            return False  # the broker answers it as always
        return True

    def _may_reauthenticate(self) -> bool:
        """Whether the session expires (else there is nothing to renew) and the last
        re-authentication started at least REAUTH_MIN_S ago."""
        if self._expires_at is None:
            return False
        started = self._reauth_started
        return started is None or self._clock() - started >= REAUTH_MIN_S

    async def handle(self, request: Request) -> Outcome:
        """Answer one request of the exchange. Raises IllegalSaslStateError where the
        connection closes without an answer."""
        if request.api_key == ApiKey.SASL_HANDSHAKE and self.state in (
            State.HANDSHAKE_OR_VERSIONS,
            State.HANDSHAKE,
            State.AUTHENTICATED,
        ):
            return self._handshake(request)
        if request.api_key == ApiKey.SASL_AUTHENTICATE and self.state is State.AUTHENTICATE:
            return await self._authenticate(request)
        state, self.state = self.state, State.FAILED
        if state is State.REAUTH_BAD_MECHANISM:
            # (Kafka's REAUTH_BAD_MECHANISM: closed, after the delay, with no answer)
            log.info("re-authentication refused: %s", self._bad_mechanism)
            return Outcome(None, close=True, delay_s=self._failed_delay_s)
        if state is State.AUTHENTICATE:
            # Kafka's handleSaslToken: the request's own error response, then the close
            message = (
                f"Unexpected Kafka request of type {_name(request.api_key)} during SASL "
                "authentication."
            )
            log.info("closing a connection: %s", message)
            return Outcome(
                None,
                close=True,
                delay_s=self._failed_delay_s,
                refusal=(ErrorCode.ILLEGAL_SASL_STATE, message),
            )
        raise IllegalSaslStateError(
            f"unexpected request {_name(request.api_key)} during SASL authentication"
        )

    async def raw_token(self, token: bytes) -> Outcome:
        """Answer one bare token (after a v0 handshake): ``response`` is bytes."""
        try:
            challenge = await self._evaluate(token)
        except SaslAuthenticationError:
            return Outcome(b"", close=True, delay_s=self._failed_delay_s)
        if self.state is State.AUTHENTICATED:
            self._session_lifetime_ms()  # (a v0 exchange cannot tell the client of it)
        return Outcome(challenge)

    def _handshake(self, request: Request) -> Outcome:
        mechanism = str(request.body.mechanism)
        reauth = self.state is State.AUTHENTICATED
        if reauth:
            self._reauth_started = self._clock()
        if reauth and request.api_version == 0:
            self.state = State.FAILED
            raise IllegalSaslStateError("re-authentication needs SaslHandshake v1")
        if mechanism not in self.mechanisms:
            self.state = State.FAILED
            log.info("SASL mechanism %r refused (enabled: %s)", mechanism, self.mechanisms)
            return Outcome(
                respond(
                    request,
                    {
                        "error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                        "mechanisms": list(self.mechanisms),
                    },
                ),
                close=True,
                delay_s=self._failed_delay_s,
            )
        if reauth and mechanism != self._mechanism:
            # Kafka's ReauthInfo.saslMechanismUnchanged: the handshake is answered, the
            # exchange it starts fails
            self._bad_mechanism = (
                f"SASL mechanism '{mechanism}' requested by client is not supported for "
                f"re-authentication of mechanism '{self._mechanism}'"
            )
            self.state = State.REAUTH_BAD_MECHANISM
            return Outcome(
                respond(
                    request, {"error_code": ErrorCode.NONE, "mechanisms": list(self.mechanisms)}
                )
            )
        self._mechanism = mechanism
        self._server = self._new_server(mechanism)
        self._reauthenticating = reauth
        self.state = State.AUTHENTICATE if request.api_version >= 1 else State.RAW_TOKENS
        return Outcome(
            respond(request, {"error_code": ErrorCode.NONE, "mechanisms": list(self.mechanisms)})
        )

    async def _authenticate(self, request: Request) -> Outcome:
        try:
            challenge = await self._evaluate(bytes(request.body.auth_bytes))
        except SaslAuthenticationError as e:
            return Outcome(
                respond(
                    request,
                    {
                        "error_code": ErrorCode.SASL_AUTHENTICATION_FAILED,
                        "error_message": str(e),
                        "auth_bytes": b"",
                        "session_lifetime": 0,
                    },
                ),
                close=True,
                delay_s=self._failed_delay_s,
            )
        lifetime_ms = 0
        if self.state is State.AUTHENTICATED:
            lifetime_ms = self._session_lifetime_ms()
        return Outcome(
            respond(
                request,
                {
                    "error_code": ErrorCode.NONE,
                    "error_message": None,
                    "auth_bytes": challenge,
                    "session_lifetime": lifetime_ms,
                },
            )
        )

    async def _evaluate(self, token: bytes) -> bytes:
        server = self._server
        assert server is not None
        try:
            challenge = await server.evaluate(token)
        except (SaslAuthenticationError, IllegalSaslStateError, UnsupportedSaslMechanismError) as e:
            self.state = State.FAILED
            log.info("SASL %s authentication failed: %s", self._mechanism, e)
            message = str(e)
            if self._reauthenticating:
                # (Kafka's authenticationOrReauthenticationText)
                message = message.replace(
                    "failed during authentication", "failed during re-authentication", 1
                )
            raise SaslAuthenticationError(message) from None
        if server.complete:
            assert server.principal is not None
            principal = str(server.principal)
            if self._reauthenticating and principal != self.principal:
                self.state = State.FAILED
                # Kafka's ReauthInfo.ensurePrincipalUnchanged: type.name
                before = (self.principal or "").replace(":", ".", 1)
                raise SaslAuthenticationError(
                    "Cannot change principals during re-authentication from "
                    f"{before}: {principal.replace(':', '.', 1)}"
                )
            if self._reauthenticating:
                log.debug("%s re-authenticated with %s", principal, self._mechanism)
            self.principal = principal
            self.state = State.AUTHENTICATED
            self._credential_lifetime_ms = server.lifetime_ms
        return challenge

    def _session_lifetime_ms(self) -> int:
        """The session's lifetime as SaslAuthenticate tells it (0: no re-authentication), and
        its expiry set from it, as Kafka's calcCompletionTimesAndReturnSessionLifetimeMs: the
        shorter of ``connections.max.reauth.ms`` and what is left of the credential (an
        OAUTHBEARER token's expiry), either alone when the other is not set."""
        expiry = self._credential_lifetime_ms
        max_reauth_ms = self._max_reauth_ms_by.get(
            self._mechanism or "", self._default_max_reauth_ms
        )
        if max_reauth_ms <= 0 and expiry is None:
            self._expires_at = None
            return 0
        left = None if expiry is None else expiry - int(time.time() * 1000)
        if left is None:
            lifetime = max_reauth_ms
        elif max_reauth_ms <= 0:
            lifetime = left
        else:
            lifetime = min(left, max_reauth_ms)
        lifetime = max(0, lifetime)
        self._expires_at = self._clock() + lifetime / 1000
        return lifetime


def _name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return str(api_key)
