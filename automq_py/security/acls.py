"""Kafka's ACL data model: bindings, binding filters, the checks CreateAcls applies, and the
format an ACL is stored in.

The enums carry Kafka's wire codes (``ResourceType``, ``PatternType``, ``AclOperation``,
``AclPermissionType`` in ``org.apache.kafka.common``); ``from_code`` maps a code this broker does
not know to ``UNKNOWN``, as Kafka's ``fromCode`` does.

A binding is stored in the key-value store under :func:`binding_key` as canonical JSON (sorted
keys, no spaces, ASCII only), so one binding always encodes to the same bytes:

=================  ======  ==========================================================
field              JSON    value
=================  ======  ==========================================================
``version``        number  ``1``; any other version is refused
``resource_type``  string  ``ResourceType`` member name, e.g. ``"TOPIC"``
``resource_name``  string  the resource name or prefix, ``"*"`` for every resource
``pattern_type``   string  ``PatternType`` member name: ``"LITERAL"`` / ``"PREFIXED"``
``principal``      string  ``"Type:name"``, e.g. ``"User:alice"``; ``"User:*"`` is anyone
``host``           string  the client's address, ``"*"`` for any host
``operation``      string  ``AclOperation`` member name, e.g. ``"READ"``
``permission``     string  ``PermissionType`` member name: ``"ALLOW"`` / ``"DENY"``
=================  ======  ==========================================================
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass
from typing import ClassVar, Self, TypeVar

from protocol.errors import ErrorCode

CLUSTER_NAME = "kafka-cluster"
WILDCARD_RESOURCE = "*"
WILDCARD_PRINCIPAL = "User:*"
WILDCARD_HOST = "*"
ACL_KV_PREFIX = "acl/"
FORMAT_VERSION = 1


class _WireEnum(enum.IntEnum):
    """An enum of Kafka wire codes whose member 0 is ``UNKNOWN``."""

    @classmethod
    def from_code(cls, code: int) -> Self:
        """The member for ``code``, or ``UNKNOWN`` for a code this broker does not know."""
        try:
            return cls(code)
        except ValueError:
            return cls(0)


class ResourceType(_WireEnum):
    """What an ACL protects (Kafka's ``ResourceType``)."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(_WireEnum):
    """How an ACL's resource name is read (Kafka's ``PatternType``). ``ANY`` and ``MATCH`` only
    appear in filters."""

    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(_WireEnum):
    """An operation on a resource (Kafka's ``AclOperation``)."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class PermissionType(_WireEnum):
    """Whether an ACL allows or denies (Kafka's ``AclPermissionType``)."""

    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


_Op = AclOperation
# Kafka's AclEntry.supportedOperations: what *_authorized_operations reports per resource type.
_SUPPORTED_OPERATIONS: dict[ResourceType, frozenset[AclOperation]] = {
    ResourceType.TOPIC: frozenset(
        (
            _Op.READ,
            _Op.WRITE,
            _Op.CREATE,
            _Op.DESCRIBE,
            _Op.DELETE,
            _Op.ALTER,
            _Op.DESCRIBE_CONFIGS,
            _Op.ALTER_CONFIGS,
        )
    ),
    ResourceType.GROUP: frozenset(
        (_Op.READ, _Op.DESCRIBE, _Op.DELETE, _Op.DESCRIBE_CONFIGS, _Op.ALTER_CONFIGS)
    ),
    ResourceType.CLUSTER: frozenset(
        (
            _Op.CREATE,
            _Op.CLUSTER_ACTION,
            _Op.DESCRIBE_CONFIGS,
            _Op.ALTER_CONFIGS,
            _Op.IDEMPOTENT_WRITE,
            _Op.ALTER,
            _Op.DESCRIBE,
        )
    ),
    ResourceType.TRANSACTIONAL_ID: frozenset((_Op.DESCRIBE, _Op.WRITE)),
    ResourceType.DELEGATION_TOKEN: frozenset((_Op.DESCRIBE,)),
    ResourceType.USER: frozenset((_Op.CREATE_TOKENS, _Op.DESCRIBE_TOKENS)),
}


def supported_operations(resource_type: ResourceType) -> frozenset[AclOperation]:
    """The operations a resource of ``resource_type`` has (Kafka's
    ``AclEntry.supportedOperations``); :class:`ValueError` for ``ANY`` / ``UNKNOWN``."""
    try:
        return _SUPPORTED_OPERATIONS[resource_type]
    except KeyError:
        raise ValueError(f"{resource_type.name} is not a concrete resource type") from None


@dataclass(slots=True, frozen=True)
class AclBinding:
    """One ACL: ``principal`` from ``host`` is allowed or denied ``operation`` on the resources
    that the (``resource_type``, ``resource_name``, ``pattern_type``) pattern names."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: PermissionType

    def to_filter(self) -> AclBindingFilter:
        """The filter that matches exactly this binding."""
        return AclBindingFilter(
            self.resource_type,
            self.resource_name,
            self.pattern_type,
            self.principal,
            self.host,
            self.operation,
            self.permission,
        )


@dataclass(slots=True, frozen=True)
class AclBindingFilter:
    """A DescribeAcls / DeleteAcls filter (Kafka's ``AclBindingFilter``): ``None`` names,
    principals and hosts, and ``ANY`` types, operations and permissions, match anything;
    ``PatternType.MATCH`` matches every pattern that would apply to ``resource_name``."""

    ANY: ClassVar[AclBindingFilter]

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: PermissionType = PermissionType.ANY

    def matches(self, binding: AclBinding) -> bool:
        """True if ``binding`` passes this filter (ResourcePatternFilter.matches and
        AccessControlEntryFilter.matches)."""
        return self._matches_pattern(binding) and self._matches_entry(binding)

    def _matches_pattern(self, binding: AclBinding) -> bool:
        if self.resource_type not in (ResourceType.ANY, binding.resource_type):
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and (
            self.pattern_type != binding.pattern_type
        ):
            return False
        if self.resource_name is None:
            return True
        if self.pattern_type in (PatternType.ANY, binding.pattern_type):
            # ANY compares names as written: a filter for "*" finds only the wildcard ACLs.
            return self.resource_name == binding.resource_name
        # MATCH: the patterns that would apply to a resource called resource_name.
        if binding.pattern_type == PatternType.LITERAL:
            return binding.resource_name in (self.resource_name, WILDCARD_RESOURCE)
        if binding.pattern_type == PatternType.PREFIXED:
            return self.resource_name.startswith(binding.resource_name)
        # Kafka throws here; a stored binding is never MATCH/ANY/UNKNOWN, so no match.
        return False

    def _matches_entry(self, binding: AclBinding) -> bool:
        if self.principal is not None and self.principal != binding.principal:
            return False
        if self.host is not None and self.host != binding.host:
            return False
        if self.operation not in (AclOperation.ANY, binding.operation):
            return False
        return self.permission in (PermissionType.ANY, binding.permission)

    def is_unknown(self) -> bool:
        """True if any type, operation or permission is ``UNKNOWN``: DeleteAcls refuses it."""
        return (
            self.resource_type == ResourceType.UNKNOWN
            or self.pattern_type == PatternType.UNKNOWN
            or self.operation == AclOperation.UNKNOWN
            or self.permission == PermissionType.UNKNOWN
        )

    def find_indefinite_field(self) -> str | None:
        """Why this filter could match more than one binding, or ``None`` if it cannot."""
        if self.resource_type == ResourceType.ANY:
            return "Resource type is ANY."
        if self.resource_type == ResourceType.UNKNOWN:
            return "Resource type is UNKNOWN."
        if self.resource_name is None:
            return "Resource name is NULL."
        if self.pattern_type == PatternType.MATCH:
            return "Resource pattern type is MATCH."
        if self.pattern_type == PatternType.UNKNOWN:
            return "Resource pattern type is UNKNOWN."
        if self.principal is None:
            return "Principal is NULL"
        if self.host is None:
            return "Host is NULL"
        if self.operation == AclOperation.ANY:
            return "Operation is ANY"
        if self.operation == AclOperation.UNKNOWN:
            return "Operation is UNKNOWN"
        if self.permission == PermissionType.ANY:
            return "Permission type is ANY"
        if self.permission == PermissionType.UNKNOWN:
            return "Permission type is UNKNOWN"
        return None

    def matches_at_most_one(self) -> bool:
        """True if no field is ``ANY``, ``UNKNOWN``, ``MATCH`` or ``None``."""
        return self.find_indefinite_field() is None


AclBindingFilter.ANY = AclBindingFilter()


def _principal_error(principal: str) -> str | None:
    principal_type, sep, _ = principal.partition(":")
    if not sep or not principal_type:
        return (
            "expected a string in format principalType:principalName but got "
            f"{principal or 'an empty string'}"
        )
    return None


def validate_new_binding(binding: AclBinding) -> tuple[ErrorCode, str | None]:
    """The CreateAcls checks for ``binding``: ``(NONE, None)`` if it may be created, else
    ``(INVALID_REQUEST, message)`` with Kafka's message (CreateAclsRequest's parse, AclApis,
    AclControlManager.validateNewAcl). Stricter than Kafka in one way: a principal that is not
    ``Type:name`` (or has an empty type) is refused here, where Kafka stores it and then fails
    the authorization checks that reach it."""
    if binding.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        return ErrorCode.INVALID_REQUEST, f"Invalid resourceType {binding.resource_type.name}"
    if binding.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return ErrorCode.INVALID_REQUEST, f"Invalid patternType {binding.pattern_type.name}"
    if binding.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        return ErrorCode.INVALID_REQUEST, f"Invalid operation {binding.operation.name}"
    if binding.permission not in (PermissionType.ALLOW, PermissionType.DENY):
        return ErrorCode.INVALID_REQUEST, f"Invalid permissionType {binding.permission.name}"
    if binding.resource_type == ResourceType.CLUSTER and binding.resource_name != CLUSTER_NAME:
        return (
            ErrorCode.INVALID_REQUEST,
            f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}",
        )
    if not binding.resource_name:
        return ErrorCode.INVALID_REQUEST, "Invalid empty resource name"
    principal_error = _principal_error(binding.principal)
    if principal_error is not None:
        return ErrorCode.INVALID_REQUEST, principal_error
    return ErrorCode.NONE, None


def validate_filter(acl_filter: AclBindingFilter) -> tuple[ErrorCode, str | None]:
    """The DescribeAcls / DeleteAcls check for a filter (AclControlManager.validateFilter):
    ``(INVALID_REQUEST, message)`` if any part of it is ``UNKNOWN``, else ``(NONE, None)``."""
    if acl_filter.resource_type == ResourceType.UNKNOWN or (
        acl_filter.pattern_type == PatternType.UNKNOWN
    ):
        return ErrorCode.INVALID_REQUEST, "Unknown patternFilter."
    if acl_filter.operation == AclOperation.UNKNOWN or (
        acl_filter.permission == PermissionType.UNKNOWN
    ):
        return ErrorCode.INVALID_REQUEST, "Unknown entryFilter."
    return ErrorCode.NONE, None


class InvalidAclRecordError(ValueError):
    """Bytes that are not a stored ACL binding."""


def encode_binding(binding: AclBinding) -> bytes:
    """The canonical JSON bytes of ``binding`` (the layout in the module docstring)."""
    doc = {
        "version": FORMAT_VERSION,
        "resource_type": binding.resource_type.name,
        "resource_name": binding.resource_name,
        "pattern_type": binding.pattern_type.name,
        "principal": binding.principal,
        "host": binding.host,
        "operation": binding.operation.name,
        "permission": binding.permission.name,
    }
    # ensure_ascii escapes lone surrogates too, so every str round-trips.
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


_E = TypeVar("_E", bound=enum.Enum)


def _str_field(doc: dict[str, object], name: str) -> str:
    value = doc.get(name)
    if not isinstance(value, str):
        raise InvalidAclRecordError(f"ACL record field {name!r} is missing or not a string")
    return value


def _enum_field(doc: dict[str, object], name: str, enum_type: type[_E]) -> _E:
    member = enum_type.__members__.get(_str_field(doc, name))
    if member is None:
        raise InvalidAclRecordError(f"ACL record field {name!r} is not a {enum_type.__name__}")
    return member


def decode_binding(data: bytes) -> AclBinding:
    """Parse bytes written by :func:`encode_binding`; :class:`InvalidAclRecordError` (a
    :class:`ValueError`) if they are not one."""
    try:
        doc = json.loads(bytes(data).decode("utf-8"))
    except RecursionError:
        raise InvalidAclRecordError("ACL record nests too deeply") from None
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise InvalidAclRecordError(f"ACL record is not UTF-8 JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidAclRecordError("ACL record is not a JSON object")
    version = doc.get("version")
    # bool is an int in Python; `true` is not version 1.
    if type(version) is not int or version != FORMAT_VERSION:
        raise InvalidAclRecordError(f"unsupported ACL record version {version!r}")
    return AclBinding(
        resource_type=_enum_field(doc, "resource_type", ResourceType),
        resource_name=_str_field(doc, "resource_name"),
        pattern_type=_enum_field(doc, "pattern_type", PatternType),
        principal=_str_field(doc, "principal"),
        host=_str_field(doc, "host"),
        operation=_enum_field(doc, "operation", AclOperation),
        permission=_enum_field(doc, "permission", PermissionType),
    )


def binding_key(binding: AclBinding) -> str:
    """The key-value store key of ``binding``: the same binding created twice has one key."""
    return ACL_KV_PREFIX + hashlib.sha256(encode_binding(binding)).hexdigest()
