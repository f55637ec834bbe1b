"""Validators of OAUTHBEARER tokens: Kafka's unsecured one (``alg: none`` JWTs, for tests and
development) and a JWKS one (JWTs signed by an identity provider whose public keys are
published at a URL, as Kafka's ``OAuthBearerValidatorCallbackHandler`` checks them).

Both answer ``validate(token) -> (principal name, expiry in epoch ms)`` or raise
:class:`OAuthBearerValidationError` saying why the token is refused (expired, bad signature,
missing scope, ...). The reason is for the broker's log: the client is told only Kafka's JSON
status (``invalid_token``, or ``insufficient_scope`` with the scope required).

=================================  ======================================================
unsecured validator option         meaning (Kafka's names, from the JAAS config)
=================================  ======================================================
unsecuredValidatorPrincipalClaimName  the claim naming the principal (``sub``)
unsecuredValidatorScopeClaimName      the claim holding the scope (``scope``)
unsecuredValidatorRequiredScope       space-separated scope values the token must hold
unsecuredValidatorAllowableClockSkewMs  clock skew allowed for ``iat`` and ``exp`` (0)
=================================  ======================================================
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any, Protocol

import jwt

from automq_py.security.errors import SaslAuthenticationError
from storage.config_def import ConfigError

log = logging.getLogger("automq.security.oauthbearer")

# the signature algorithms a JWKS validator accepts, by the key type each needs
JWS_ALGORITHMS = {
    "RS256": "RSA",
    "RS384": "RSA",
    "RS512": "RSA",
    "PS256": "RSA",
    "PS384": "RSA",
    "PS512": "RSA",
    "ES256": "EC",
    "ES384": "EC",
    "ES512": "EC",
}
_MAX_JWKS_BYTES = 1 << 20
# after a failed JWKS fetch, the least time before the next attempt
_FETCH_RETRY_S = 1.0


class OAuthBearerValidationError(SaslAuthenticationError):
    """A token refused, and why. ``scope`` is the scope required when the token lacked it
    (Kafka then answers ``insufficient_scope``)."""

    def __init__(self, message: str, scope: str | None = None) -> None:
        super().__init__(message)
        self.scope = scope


class OAuthBearerValidator(Protocol):
    """Checks a bearer token: what OAuthBearerServer asks."""

    async def validate(self, token: str) -> tuple[str, int]:
        """The token's principal name and expiry (epoch ms); OAuthBearerValidationError (or
        SaslAuthenticationError) when it is refused."""
        ...


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _seconds_to_ms(value: float) -> int:
    # Java's Math.round(seconds * 1000): half up
    return int((value * 1000 + 0.5) // 1)


# --- unsecured JWS -----------------------------------------------------------------------

# RFC 6749's scope-token characters (Kafka's OAuthBearerScopeUtils)
_SCOPE_TOKEN = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")
_OPTION_PREFIX = "unsecuredValidator"


class UnsecuredJwsValidator:
    """Kafka's OAuthBearerUnsecuredValidatorCallbackHandler: an unsigned JWT (``alg: none``,
    empty signature) with a numeric ``exp``, a principal claim that is a non-blank string,
    ``iat`` (if any) not in the future and before ``exp``, and the required scope if any.

    Options are read (and refused with a :class:`ConfigError` naming ``property_name``) once,
    here, where Kafka reads them at each login.
    """

    def __init__(self, options: Mapping[str, str], property_name: str = "sasl.jaas.config") -> None:
        def option(name: str) -> str:
            return options.get(_OPTION_PREFIX + name, "").strip()

        self.principal_claim = option("PrincipalClaimName") or "sub"
        self.scope_claim = option("ScopeClaimName") or "scope"
        self.required_scope: list[str] = []
        for item in option("RequiredScope").split(" "):
            if item and not _SCOPE_TOKEN.fullmatch(item):
                raise ConfigError(f"{property_name}: Invalid scope value: {item}")
            if item:
                self.required_scope.append(item)
        skew = option("AllowableClockSkewMs") or "0"
        if not re.fullmatch(r"[+-]?[0-9]{1,10}", skew) or int(skew) > (1 << 31) - 1:
            raise ConfigError(f"{property_name}: {_OPTION_PREFIX}AllowableClockSkewMs: {skew}")
        self.allowable_clock_skew_ms = int(skew)
        if self.allowable_clock_skew_ms < 0:
            raise ConfigError(
                f"{property_name}: Allowable clock skew millis must not be negative: {skew}"
            )

    async def validate(self, token: str) -> tuple[str, int]:
        """The principal and expiry of an unsecured JWS; OAuthBearerValidationError saying
        which of Kafka's checks it failed."""
        return self.check(token, int(time.time() * 1000))

    def check(self, token: str, now_ms: int) -> tuple[str, int]:
        """:meth:`validate` at a given time."""
        header, claims = _unsecured_parts(token)
        alg = header.get("alg")
        if alg is None:
            raise OAuthBearerValidationError("JWS header must have an Algorithm value")
        if alg != "none":
            raise OAuthBearerValidationError("Unsecured JWS must have 'none' for an algorithm")
        scope = self._scope(claims)
        exp = claims.get("exp")
        if exp is None:
            raise OAuthBearerValidationError("No expiration time in JWT")
        if not _is_number(exp):
            raise OAuthBearerValidationError("The 'exp' claim was not of type Number")
        principal = claims.get(self.principal_claim)
        if principal is not None and not isinstance(principal, str):
            raise OAuthBearerValidationError(
                f"The '{self.principal_claim}' claim was not of type String"
            )
        if principal is None or not principal.strip():
            raise OAuthBearerValidationError(
                f"No principal name in JWT claim: {self.principal_claim}"
            )
        iat = claims.get("iat")
        if iat is not None and not _is_number(iat):
            raise OAuthBearerValidationError("The 'iat' claim was not of type Number")
        skew = self.allowable_clock_skew_ms
        if iat is not None and 1000 * iat > now_ms + skew:
            raise OAuthBearerValidationError(
                f"The Issued At value ({iat:f} seconds) was after the indicated time ({now_ms} "
                f"ms) plus allowable clock skew ({skew} ms)"
            )
        if now_ms - skew >= 1000 * exp:
            raise OAuthBearerValidationError(
                f"The indicated time ({now_ms} ms) minus allowable clock skew ({skew} ms) was "
                f"on or after the Expiration Time value ({exp:f} seconds)"
            )
        if iat is not None and exp <= iat:
            raise OAuthBearerValidationError(
                f"The Expiration Time time ({exp:f} seconds) was not after the Issued At time "
                f"({iat:f} seconds)"
            )
        for required in self.required_scope:
            if required not in scope:
                # the scope Kafka reports is Java's List.toString of the required scope
                raise OAuthBearerValidationError(
                    f"The provided scope ({sorted(scope)}) was missing a required scope "
                    f"({required}).  All required scope elements: {self.required_scope}",
                    scope="[" + ", ".join(self.required_scope) + "]",
                )
        return principal, _seconds_to_ms(exp)

    def _scope(self, claims: dict[str, Any]) -> set[str]:
        value = claims.get(self.scope_claim)
        if value is None:
            return set()
        if isinstance(value, str):
            # Kafka: a string claim is one scope value, not split at spaces
            return {value.strip()} if value.strip() else set()
        if not isinstance(value, list):
            raise OAuthBearerValidationError(f"The '{self.scope_claim}' claim was not of type List")
        return {str(v).strip() for v in value if str(v).strip()}


def _unsecured_parts(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    if ".." in token:
        raise OAuthBearerValidationError("Malformed compact serialization contains '..'")
    splits = token.split(".")
    if len(splits) != 3:
        raise OAuthBearerValidationError(
            "Unsecured JWS compact serializations must have 3 dot-separated Base64URL-encoded "
            "values"
        )
    header = _json_object(splits[0])
    claims = _json_object(splits[1])
    if splits[2]:
        raise OAuthBearerValidationError("Unsecured JWS must not contain a digital signature")
    return header, claims


def _json_object(split: str) -> dict[str, Any]:
    try:
        raw = base64.b64decode(split + "=" * (-len(split) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise OAuthBearerValidationError("malformed Base64 URL encoded value") from None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise OAuthBearerValidationError("malformed JSON") from None
    if not isinstance(value, dict):
        raise OAuthBearerValidationError("malformed JSON")
    return value


# --- JWKS --------------------------------------------------------------------------------


class JwksValidator:
    """JWTs signed with a key of the JSON Web Key Set at ``jwks_url``, checked with PyJWT as
    Kafka's BrokerJwtValidator checks them with jose4j: a signature by one of the keys
    (RS*/PS*/ES*; ``none`` and HMAC refused), ``exp`` and ``iat`` present, ``exp`` and ``nbf``
    held with ``clock_skew_s`` of slack, ``aud`` holding one of ``expected_audience`` (and no
    ``aud`` when none is expected), ``iss`` equal to ``expected_issuer`` when set, and a
    non-blank string in ``sub_claim`` as the principal.

    The key set is fetched (urllib, in a worker thread: the event loop never waits on the
    network) at the first validation and again once it is ``refresh_ms`` old; a token naming a
    key id the set lacks fetches it again at once, at most once per ``refresh_ms``. A failed
    fetch keeps the keys already known.
    """

    def __init__(
        self,
        jwks_url: str,
        refresh_ms: int,
        expected_audience: list[str] | None = None,
        expected_issuer: str | None = None,
        sub_claim: str = "sub",
        scope_claim: str = "scope",
        clock_skew_s: int = 30,
        *,
        fetch_timeout_s: float = 10.0,
    ) -> None:
        scheme = urllib.parse.urlsplit(jwks_url).scheme.lower()
        if scheme not in ("http", "https", "file"):
            raise ConfigError(
                f"sasl.oauthbearer.jwks.endpoint.url: an http, https or file URL is needed, got "
                f"{jwks_url!r}"
            )
        if refresh_ms < 0:
            raise ConfigError("sasl.oauthbearer.jwks.endpoint.refresh.ms: must be non-negative")
        if clock_skew_s < 0:
            raise ConfigError("sasl.oauthbearer.clock.skew.seconds: must be non-negative")
        if not sub_claim.strip():
            raise ConfigError("sasl.oauthbearer.sub.claim.name: must not be blank")
        if not scope_claim.strip():
            raise ConfigError("sasl.oauthbearer.scope.claim.name: must not be blank")
        self.jwks_url = jwks_url
        self.refresh_s = refresh_ms / 1000
        self.expected_audience = list(expected_audience) if expected_audience else None
        self.expected_issuer = expected_issuer
        self.sub_claim = sub_claim.strip()
        self.scope_claim = scope_claim.strip()
        self.clock_skew_s = clock_skew_s
        self._fetch_timeout_s = fetch_timeout_s
        self._keys: list[dict[str, Any]] | None = None
        self._fetched_at = 0.0  # monotonic time of the last successful fetch
        self._attempted_at = 0.0  # ... of the last attempt, successful or not
        self._failed = False
        self._unknown_kid_fetch_at: float | None = None
        self._fetches = 0  # successful fetches so far (tells a waiter one happened)
        self._lock = asyncio.Lock()

    @property
    def fetches(self) -> int:
        """How many times the key set was fetched."""
        return self._fetches

    async def validate(self, token: str) -> tuple[str, int]:
        """The principal and expiry (epoch ms) of a token signed by a key of the set."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as e:
            raise OAuthBearerValidationError(f"malformed JWT: {e}") from None
        alg = header.get("alg")
        kid = header.get("kid")
        if not isinstance(alg, str) or alg not in JWS_ALGORITHMS:
            raise OAuthBearerValidationError(f"JWS algorithm {alg!r} is not accepted")
        if kid is not None and not isinstance(kid, str):
            raise OAuthBearerValidationError("JWS key id (kid) is not a string")
        fetches = self._fetches
        await self._fresh_keys()
        keys = self._candidates(kid, alg)
        # (keys fetched just now for this token are not fetched again)
        if not keys and self._fetches == fetches and self._may_fetch_for_unknown_kid():
            await self._fetch(self._fetches)
            keys = self._candidates(kid, alg)
        if not keys:
            raise OAuthBearerValidationError(
                f"no key in the JWKS at {self.jwks_url} for kid {kid!r} and algorithm {alg}"
            )
        claims = self._decode(token, alg, keys)
        principal = claims.get(self.sub_claim)
        if not isinstance(principal, str) or not principal.strip():
            raise OAuthBearerValidationError(
                f"the '{self.sub_claim}' claim is missing or not a non-blank string"
            )
        return principal, _seconds_to_ms(float(claims["exp"]))

    async def _fresh_keys(self) -> None:
        now = time.monotonic()
        stale = self._keys is None or now - self._fetched_at >= self.refresh_s
        backing_off = self._failed and now - self._attempted_at < _FETCH_RETRY_S
        if stale and not backing_off:
            await self._fetch(self._fetches)
        if self._keys is None:
            raise OAuthBearerValidationError(f"the JWKS at {self.jwks_url} could not be fetched")

    def _may_fetch_for_unknown_kid(self) -> bool:
        now = time.monotonic()
        last = self._unknown_kid_fetch_at
        if last is not None and now - last < self.refresh_s:
            return False
        self._unknown_kid_fetch_at = now
        return True

    async def _fetch(self, seen: int) -> None:
        """Fetch the key set unless another task did since ``seen`` fetches."""
        async with self._lock:
            if self._fetches != seen:
                return
            self._attempted_at = time.monotonic()
            try:
                keys = await asyncio.to_thread(_fetch_jwks, self.jwks_url, self._fetch_timeout_s)
            except (OSError, ValueError, RecursionError) as e:
                self._failed = True
                log.warning("fetching the JWKS at %s failed: %s", self.jwks_url, e)
                return
            self._keys = keys
            self._failed = False
            self._fetched_at = time.monotonic()
            self._fetches += 1

    def _candidates(self, kid: str | None, alg: str) -> list[jwt.PyJWK]:
        out = []
        for jwk in self._keys or ():
            if kid is not None and jwk.get("kid") != kid:
                continue
            if jwk.get("kty") != JWS_ALGORITHMS[alg] or jwk.get("use", "sig") != "sig":
                continue
            if jwk.get("alg", alg) != alg:
                continue
            try:
                out.append(jwt.PyJWK(jwk, alg))
            except jwt.PyJWTError:
                continue  # a key PyJWT cannot use (another curve, say): not a candidate
        return out

    def _decode(self, token: str, alg: str, keys: list[jwt.PyJWK]) -> dict[str, Any]:
        bad_signature: jwt.PyJWTError | None = None
        for key in keys:
            try:
                claims: dict[str, Any] = jwt.decode(
                    token,
                    key,
                    algorithms=[alg],
                    audience=self.expected_audience,
                    issuer=self.expected_issuer,
                    leeway=self.clock_skew_s,
                    options={"require": ["exp", "iat"]},
                )
                return claims
            except (jwt.InvalidSignatureError, jwt.InvalidKeyError) as e:
                bad_signature = e  # perhaps another key of the same kid/type signed it
            except jwt.ExpiredSignatureError:
                raise OAuthBearerValidationError("the token has expired (exp)") from None
            except jwt.PyJWTError as e:
                raise OAuthBearerValidationError(f"the token was refused: {e}") from None
        raise OAuthBearerValidationError(f"bad signature: {bad_signature}")


# no proxy from the environment: the broker's settings are its configuration alone
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _fetch_jwks(url: str, timeout_s: float) -> list[dict[str, Any]]:
    """The keys of the JWK set at ``url`` (blocking: run in a thread)."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with _OPENER.open(request, timeout=timeout_s) as response:
        body = response.read(_MAX_JWKS_BYTES + 1)
    if len(body) > _MAX_JWKS_BYTES:
        raise ValueError(f"the JWKS is larger than {_MAX_JWKS_BYTES} bytes")
    document = json.loads(body)
    keys = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(keys, list):
        raise ValueError("the JWKS has no 'keys' array")
    return [k for k in keys if isinstance(k, dict)]
