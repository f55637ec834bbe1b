"""Client quota configs, as Kafka keeps and matches them: per user, per client id, or per both,
with ``<default>`` entities, in the metadata store.

Keys ``quota/users/<user>/clients/<client-id>`` (either part may be absent), each name
URL-encoded as Kafka sanitizes it, so ``<default>`` (the default entity) cannot be a name; the
value is the JSON of the entity's quota keys. Which config limits a client is Kafka's order
(:func:`matching_entities`): the most specific entity that sets the quota key wins, and the
entity it names is the one whose clients share the limit.

Pure functions over the KV image, as the metadata's other changes are: AlterClientQuotas
(:func:`plan_alter`) and DescribeClientQuotas (:func:`describe`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote

from protocol.errors import ErrorCode
from storage.metadata import records as rec

KV_PREFIX = "quota/"
DEFAULT = "<default>"
USER = "user"
CLIENT_ID = "client-id"
ENTITY_TYPES = (USER, CLIENT_ID)
IP = "ip"  # (a type DescribeClientQuotas knows: no IP quota is kept, so none matches)
# the quota keys and whether their values must be whole numbers (Kafka's LONG ones)
QUOTA_KEYS = {
    "producer_byte_rate": True,
    "consumer_byte_rate": True,
    "request_percentage": False,
    "controller_mutation_rate": False,
}
# DescribeClientQuotas' match types
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2

# an entity: (entity type, name or None for the default entity), in ENTITY_TYPES order
Entity = tuple[tuple[str, str | None], ...]


def entity_key(entity: Entity) -> str:
    parts = []
    for kind, name in entity:
        segment = "users" if kind == USER else "clients"
        parts.append(f"{segment}/{DEFAULT if name is None else quote(name, safe='')}")
    return KV_PREFIX + "/".join(parts)


def parse_key(key: str) -> Entity:
    """The entity a KV key names (ValueError if it names none)."""
    parts = key[len(KV_PREFIX) :].split("/")
    if len(parts) not in (2, 4):
        raise ValueError(f"not a quota key: {key!r}")
    out: list[tuple[str, str | None]] = []
    for segment, raw in zip(parts[::2], parts[1::2], strict=True):
        kind = {"users": USER, "clients": CLIENT_ID}.get(segment)
        if kind is None:
            raise ValueError(f"not a quota key: {key!r}")
        out.append((kind, None if raw == DEFAULT else unquote(raw)))
    return normalized(out)


def normalized(entity: Iterable[tuple[str, str | None]]) -> Entity:
    return tuple(sorted(entity, key=lambda part: ENTITY_TYPES.index(part[0])))


def configs(kv: Mapping[str, bytes]) -> dict[Entity, dict[str, float]]:
    """Every entity's quota configs."""
    out = {}
    for key, raw in kv.items():
        if key.startswith(KV_PREFIX):
            try:
                out[parse_key(key)] = {str(k): float(v) for k, v in json.loads(raw).items()}
            except (ValueError, AttributeError):
                continue
    return out


def matching_entities(user: str, client_id: str) -> list[Entity]:
    """The entities whose configs may limit ``user``'s client ``client_id``, most specific
    first (Kafka's DefaultQuotaCallback order)."""
    return [
        ((USER, user), (CLIENT_ID, client_id)),
        ((USER, user), (CLIENT_ID, None)),
        ((USER, user),),
        ((USER, None), (CLIENT_ID, client_id)),
        ((USER, None), (CLIENT_ID, None)),
        ((USER, None),),
        ((CLIENT_ID, client_id),),
        ((CLIENT_ID, None),),
    ]


def sensor_of(entity: Entity, user: str, client_id: str) -> tuple[str, str]:
    """The (user, client id) whose clients share the limit ``entity`` sets: those it names,
    the default entity's standing for each client of it."""
    kinds = dict(entity)
    return (user if USER in kinds else "", client_id if CLIENT_ID in kinds else "")


@dataclass(slots=True, frozen=True)
class Op:
    key: str
    value: float
    remove: bool


@dataclass(slots=True, frozen=True)
class Alteration:
    entity: list[tuple[str, str | None]]
    ops: list[Op]


def _check(alteration: Alteration) -> tuple[ErrorCode, str | None]:
    kinds = [kind for kind, _ in alteration.entity]
    if not kinds:
        return ErrorCode.INVALID_REQUEST, "Invalid empty client quota entity"
    if len(set(kinds)) != len(kinds):
        return ErrorCode.INVALID_REQUEST, "Duplicate entity type in client quota entity"
    for kind in kinds:
        if kind not in ENTITY_TYPES:
            return ErrorCode.INVALID_REQUEST, f"Unhandled client quota entity type: {kind}"
    for name in (n for _, n in alteration.entity):
        if name == "":
            return ErrorCode.INVALID_REQUEST, "Empty entity name is not allowed"
    seen: set[str] = set()
    for op in alteration.ops:
        if op.key in seen:
            return ErrorCode.INVALID_REQUEST, f"Duplicate quota key: {op.key}"
        seen.add(op.key)
        if op.remove:  # (a key not set, or no quota key at all, is nothing to remove)
            continue
        if op.key not in QUOTA_KEYS:
            return ErrorCode.INVALID_REQUEST, f"Invalid configuration key {op.key}"
        if not op.value > 0:
            return ErrorCode.INVALID_REQUEST, f"Quota {op.key} must be positive, got {op.value}"
        if QUOTA_KEYS[op.key] and (not math.isfinite(op.value) or op.value != int(op.value)):
            return ErrorCode.INVALID_REQUEST, f"Configuration {op.key} must be a Long value"
    return ErrorCode.NONE, None


def plan_alter(
    kv: Mapping[str, bytes], alterations: Sequence[Alteration], validate_only: bool
) -> tuple[list[rec.Record], list[tuple[ErrorCode, str | None]]]:
    """The records and per-entry results of one AlterClientQuotas."""
    out: list[rec.Record] = []
    results = []
    altered: set[Entity] = set()
    for alteration in alterations:
        code, message = _check(alteration)
        if code == ErrorCode.NONE:
            entity = normalized(alteration.entity)
            if entity in altered:  # as Kafka: the first alteration of an entity only
                code, message = ErrorCode.INVALID_REQUEST, f"Ignoring duplicate entity {entity}"
            altered.add(entity)
        results.append((code, message))
        if code != ErrorCode.NONE or validate_only:
            continue
        key = entity_key(entity)
        raw = kv.get(key)
        current = {} if raw is None else json.loads(raw)
        for op in alteration.ops:
            if op.remove:
                current.pop(op.key, None)
            else:
                current[op.key] = op.value
        if current:
            out.append(rec.KVRecord(key, json.dumps(current, sort_keys=True).encode()))
        elif raw is not None:
            out.append(rec.RemoveKV(key))
    return out, results


@dataclass(slots=True, frozen=True)
class Component:
    entity_type: str
    match_type: int
    match: str | None


def describe(
    kv: Mapping[str, bytes], components: Sequence[Component], strict: bool
) -> tuple[ErrorCode, str | None, list[tuple[Entity, dict[str, float]]]]:
    """DescribeClientQuotas: the entities matching every component (and, with ``strict``,
    naming no other entity type), with their quota values."""
    types: list[str] = []
    for c in components:  # one at a time, as Kafka's ClientQuotasImage checks them
        invalid = ErrorCode.INVALID_REQUEST
        if c.entity_type in types:
            return invalid, f"Duplicate {c.entity_type} filter component entity type", []
        if not c.entity_type:
            return invalid, "Unexpected empty filter component entity type", []
        if c.entity_type not in (*ENTITY_TYPES, IP):
            message = f"Custom entity type {c.entity_type} not supported"
            return ErrorCode.UNSUPPORTED_VERSION, message, []
        if c.match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED):
            return invalid, f"Unknown match type {c.match_type}", []
        if (c.match_type == MATCH_EXACT) != (c.match is not None):
            kind = {MATCH_EXACT: "an exact", MATCH_DEFAULT: "a default"}.get(c.match_type, "any")
            return invalid, f"Unexpected match string for {kind} match: {c.match!r}", []
        types.append(c.entity_type)
    if IP in types and len(types) > 1:
        message = (
            "Invalid entity filter component combination, IP filter component should not be "
            "used with user or clientId filter component."
        )
        return ErrorCode.INVALID_REQUEST, message, []
    out = []
    for entity, values in sorted(configs(kv).items(), key=lambda item: entity_key(item[0])):
        names = dict(entity)
        if strict and set(names) != set(types):
            continue
        if all(_matches(c, names) for c in components):
            out.append((entity, values))
    return ErrorCode.NONE, None, out


def _matches(component: Component, names: Mapping[str, str | None]) -> bool:
    if component.entity_type not in names:
        return False
    name = names[component.entity_type]
    if component.match_type == MATCH_EXACT:
        return name == component.match
    if component.match_type == MATCH_DEFAULT:
        return name is None
    return True  # any entity of the type, the default one too
