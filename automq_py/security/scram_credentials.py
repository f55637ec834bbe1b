"""SCRAM credentials in the metadata store, as Kafka's ScramControlManager keeps them: per user
and mechanism the salt, StoredKey, ServerKey and iteration count, never the password.

Keys ``scram/<mechanism>/<user>``, each a JSON object. AlterUserScramCredentials carries the
salt and the salted password (the client derives it); the keys are derived here and the
salted password dropped. Planning is pure (:func:`plan_alter` over the KV image), as the
metadata's other changes are; every broker of a cluster reads the same keys.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from automq_py.security.sasl_mechanisms import (
    SCRAM_MAX_ITERATIONS,
    SCRAM_MIN_ITERATIONS,
    ScramCredential,
    scram_credential,
)
from protocol.errors import ErrorCode
from storage.metadata import records as rec

KV_PREFIX = "scram/"
# AlterUserScramCredentials' and DescribeUserScramCredentials' mechanism codes
MECHANISM_CODES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
CODES = {name: code for code, name in MECHANISM_CODES.items()}


def credential_key(mechanism: str, user: str) -> str:
    return f"{KV_PREFIX}{mechanism}/{user}"


def encode_credential(c: ScramCredential) -> bytes:
    return json.dumps(
        {
            "salt": base64.b64encode(c.salt).decode(),
            "stored_key": base64.b64encode(c.stored_key).decode(),
            "server_key": base64.b64encode(c.server_key).decode(),
            "iterations": c.iterations,
        },
        sort_keys=True,
    ).encode()


def decode_credential(raw: bytes) -> ScramCredential:
    d = json.loads(raw)
    return ScramCredential(
        base64.b64decode(d["salt"]),
        base64.b64decode(d["stored_key"]),
        base64.b64decode(d["server_key"]),
        int(d["iterations"]),
    )


def lookup(kv: Mapping[str, bytes], mechanism: str, user: str) -> ScramCredential | None:
    """The credential ``user`` has for ``mechanism``, if any."""
    raw = kv.get(credential_key(mechanism, user))
    return None if raw is None else decode_credential(raw)


@dataclass(slots=True, frozen=True)
class Deletion:
    user: str
    mechanism: int


@dataclass(slots=True, frozen=True)
class Upsertion:
    user: str
    mechanism: int
    iterations: int
    salt: bytes
    salted_password: bytes


@dataclass(slots=True, frozen=True)
class UserResult:
    user: str
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str | None = None


def plan_alter(
    kv: Mapping[str, bytes], deletions: Sequence[Deletion], upsertions: Sequence[Upsertion]
) -> tuple[list[rec.Record], list[UserResult]]:
    """The records and per-user results of one AlterUserScramCredentials, as Kafka's
    ScramControlManager decides them: the deletions then the upsertions, each user taking at
    most one alteration. A user's first alteration refused is its result; a second one, of
    either kind and any mechanism, makes the user DUPLICATE_RESOURCE and none of its
    alterations is applied."""
    items: list[Deletion | Upsertion] = [*deletions, *upsertions]
    order: list[str] = []
    errors: dict[str, tuple[ErrorCode, str]] = {}
    accepted: set[str] = set()

    def refuse(user: str, code: ErrorCode, message: str) -> None:
        errors.setdefault(user, (code, message))

    for item in items:
        user = item.user
        if user not in order:
            order.append(user)
        if user in errors:
            continue
        if user in accepted:
            accepted.discard(user)
            refuse(
                user,
                ErrorCode.DUPLICATE_RESOURCE,
                "A user credential cannot be altered twice in the same request",
            )
        elif not user:
            refuse(user, ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
        elif item.mechanism not in MECHANISM_CODES:
            refuse(user, ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
        elif isinstance(item, Deletion):
            if credential_key(MECHANISM_CODES[item.mechanism], user) not in kv:
                refuse(
                    user,
                    ErrorCode.RESOURCE_NOT_FOUND,
                    "Attempt to delete a user credential that does not exist",
                )
            else:
                accepted.add(user)
        elif item.iterations < SCRAM_MIN_ITERATIONS:
            refuse(user, ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations")
        elif item.iterations > SCRAM_MAX_ITERATIONS:
            refuse(user, ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations")
        elif not item.salt or not item.salted_password:
            refuse(user, ErrorCode.UNACCEPTABLE_CREDENTIAL, "Salt and salted password are needed")
        else:
            accepted.add(user)
    out: list[rec.Record] = []
    for d in deletions:
        if d.user not in errors:
            out.append(rec.RemoveKV(credential_key(MECHANISM_CODES[d.mechanism], d.user)))
    for u in upsertions:
        if u.user not in errors:
            mechanism = MECHANISM_CODES[u.mechanism]
            credential = scram_credential(mechanism, u.salted_password, u.salt, u.iterations)
            out.append(
                rec.KVRecord(credential_key(mechanism, u.user), encode_credential(credential))
            )
    results = [
        UserResult(user, *errors[user]) if user in errors else UserResult(user) for user in order
    ]
    return out, results


@dataclass(slots=True, frozen=True)
class UserCredentials:
    user: str
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str | None = None
    # (mechanism code, iterations) of each credential the user has
    credentials: tuple[tuple[int, int], ...] = ()


def describe(kv: Mapping[str, bytes], users: Iterable[str] | None) -> list[UserCredentials]:
    """DescribeUserScramCredentials: every user with a credential (``users`` None), or those
    asked for, each with its mechanisms and iterations; asking twice for one user, or for one
    without credentials, is an error for that user."""
    held: dict[str, list[tuple[int, int]]] = {}
    for key in sorted(k for k in kv if k.startswith(KV_PREFIX)):
        mechanism, _, user = key[len(KV_PREFIX) :].partition("/")
        if mechanism in CODES:
            held.setdefault(user, []).append(
                (CODES[mechanism], decode_credential(kv[key]).iterations)
            )
    if users is None:
        return [UserCredentials(u, credentials=tuple(c)) for u, c in sorted(held.items())]
    asked = list(users)
    out = []
    for user in dict.fromkeys(asked):
        if asked.count(user) > 1:
            out.append(
                UserCredentials(
                    user,
                    ErrorCode.DUPLICATE_RESOURCE,
                    "Cannot describe SCRAM credentials for the same user twice in a single "
                    f"request: {user}",
                )
            )
        elif user not in held:
            out.append(
                UserCredentials(
                    user,
                    ErrorCode.RESOURCE_NOT_FOUND,
                    f"Attempt to describe a user credential that does not exist: {user}",
                )
            )
        else:
            out.append(UserCredentials(user, credentials=tuple(held[user])))
    return out
