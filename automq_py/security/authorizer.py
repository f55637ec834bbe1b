"""Kafka's ``StandardAuthorizer``: which principal may do what, from the ACLs in force.

The rules are ``StandardAuthorizerData``'s: super users may do anything; otherwise the ACLs
whose resource pattern applies to the resource (the literal name, the literal ``"*"``, and every
prefix of the name) are checked, and one matching DENY denies, else one matching ALLOW allows,
else the request is denied, unless no ACL at all applies to the resource, in which case
``allow.everyone.if.no.acl.found`` decides. An ACL matches a request when its principal is the
request's or ``User:*``, its host is the client's or ``"*"``, and its operation is the one asked
for or ``ALL``; an ALLOW of READ, WRITE, DELETE or ALTER also allows DESCRIBE, and an ALLOW of
ALTER_CONFIGS also allows DESCRIBE_CONFIGS (a DENY implies nothing).

Checks run on every request, so :meth:`StandardAuthorizer.load` indexes the ACLs by resource type
and name: a check costs the ACLs that apply to the resource, not all ACLs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from automq_py.security.acls import (
    WILDCARD_HOST,
    WILDCARD_PRINCIPAL,
    WILDCARD_RESOURCE,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
    supported_operations,
)

_IMPLIES_DESCRIBE = frozenset(
    (
        AclOperation.DESCRIBE,
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.DELETE,
        AclOperation.ALTER,
    )
)
_IMPLIES_DESCRIBE_CONFIGS = frozenset((AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS))

# Kafka's Authorizer.authorizeByResourceType first authorizes this made-up literal name, so that
# super users, wildcard ACLs and allow.everyone.if.no.acl.found answer as a real resource would.
_HARDCODE_RESOURCE = "hardcode"

_ResourceKey = tuple[ResourceType, str]


@dataclass(slots=True, frozen=True)
class _AclIndex:
    """One consistent set of ACLs and its lookups; :meth:`StandardAuthorizer.load` swaps in a
    new one whole, so a check never sees half of an update."""

    bindings: tuple[AclBinding, ...]
    by_type: dict[ResourceType, tuple[AclBinding, ...]]
    literal: dict[_ResourceKey, tuple[AclBinding, ...]]
    prefixed: dict[_ResourceKey, tuple[AclBinding, ...]]
    # The distinct prefix lengths per type, ascending: a check probes name[:n] for each.
    prefix_lengths: dict[ResourceType, tuple[int, ...]]

    @classmethod
    def build(cls, bindings: Iterable[AclBinding]) -> _AclIndex:
        """Index ``bindings``, dropping duplicates (the same ACL created twice is one ACL)."""
        unique = tuple(dict.fromkeys(bindings))
        by_type: defaultdict[ResourceType, list[AclBinding]] = defaultdict(list)
        literal: defaultdict[_ResourceKey, list[AclBinding]] = defaultdict(list)
        prefixed: defaultdict[_ResourceKey, list[AclBinding]] = defaultdict(list)
        for b in unique:
            by_type[b.resource_type].append(b)
            key = (b.resource_type, b.resource_name)
            if b.pattern_type == PatternType.LITERAL:
                literal[key].append(b)
            elif b.pattern_type == PatternType.PREFIXED:
                prefixed[key].append(b)
            # Other pattern types never apply to a resource; describe() still lists them.
        lengths: defaultdict[ResourceType, set[int]] = defaultdict(set)
        for resource_type, prefix in prefixed:
            lengths[resource_type].add(len(prefix))
        return cls(
            bindings=unique,
            by_type={k: tuple(v) for k, v in by_type.items()},
            literal={k: tuple(v) for k, v in literal.items()},
            prefixed={k: tuple(v) for k, v in prefixed.items()},
            prefix_lengths={k: tuple(sorted(v)) for k, v in lengths.items()},
        )

    def applying_to(
        self, resource_type: ResourceType, name: str
    ) -> Iterator[tuple[AclBinding, ...]]:
        """The groups of ACLs whose pattern applies to the resource ``name``: its literal ACLs,
        the literal wildcard ACLs, and the prefixed ACLs for each prefix of ``name``."""
        exact = self.literal.get((resource_type, name))
        if exact:
            yield exact
        if name != WILDCARD_RESOURCE:
            wildcard = self.literal.get((resource_type, WILDCARD_RESOURCE))
            if wildcard:
                yield wildcard
        for n in self.prefix_lengths.get(resource_type, ()):
            if n > len(name):
                break
            group = self.prefixed.get((resource_type, name[:n]))
            if group:
                yield group


def _acl_result(acl: AclBinding, principal: str, host: str, operation: AclOperation) -> bool | None:
    """True if ``acl`` allows the request, False if it denies it, None if it does not match the
    request's principal, host or operation (StandardAuthorizerData.findResult); the resource is
    assumed to match."""
    if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
        return None
    if acl.host != WILDCARD_HOST and acl.host != host:
        return None
    allow = acl.permission == PermissionType.ALLOW
    if acl.operation != AclOperation.ALL:
        if not allow:
            # A DENY implies nothing: DENY READ does not deny DESCRIBE.
            if operation != acl.operation:
                return None
        elif operation == AclOperation.DESCRIBE:
            if acl.operation not in _IMPLIES_DESCRIBE:
                return None
        elif operation == AclOperation.DESCRIBE_CONFIGS:
            if acl.operation not in _IMPLIES_DESCRIBE_CONFIGS:
                return None
        elif operation != acl.operation:
            return None
    # As in Kafka, any permission other than ALLOW denies (validated ACLs are ALLOW or DENY).
    return allow


def _check_principal(principal: str) -> str:
    principal_type, sep, _ = principal.partition(":")
    if not sep or not principal_type:
        raise ValueError(
            f"super user {principal!r}: expected a string in format principalType:principalName"
        )
    return principal


class StandardAuthorizer:
    """Authorizes requests against the ACLs last given to :meth:`load`, as Kafka's
    ``StandardAuthorizer`` does (``super.users``, ``allow.everyone.if.no.acl.found``)."""

    def __init__(
        self, super_users: Iterable[str] = (), allow_everyone_if_no_acl_found: bool = False
    ) -> None:
        """``super_users`` are ``Type:name`` principals (:class:`ValueError` otherwise) that may
        do anything whatever the ACLs say."""
        self.super_users = frozenset(_check_principal(p) for p in super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._index = _AclIndex.build(())

    def load(self, bindings: Iterable[AclBinding]) -> None:
        """Replace all ACLs with ``bindings``."""
        self._index = _AclIndex.build(bindings)

    def bindings(self) -> list[AclBinding]:
        """Every ACL in force, each once, in the order loaded."""
        return list(self._index.bindings)

    def describe(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        """The ACLs that ``acl_filter`` matches (DescribeAcls; DeleteAcls' selection)."""
        index = self._index
        if acl_filter.resource_type == ResourceType.ANY:
            candidates = index.bindings
        else:
            candidates = index.by_type.get(acl_filter.resource_type, ())
        return [b for b in candidates if acl_filter.matches(b)]

    def authorize(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        resource_name: str,
    ) -> bool:
        """True if ``principal`` connecting from ``host`` may do ``operation`` on the resource
        ``resource_name`` of ``resource_type``."""
        if principal in self.super_users:
            return True
        found_acl = False
        allowed = False
        for group in self._index.applying_to(resource_type, resource_name):
            found_acl = True
            for acl in group:
                result = _acl_result(acl, principal, host, operation)
                if result is False:
                    return False
                if result:
                    allowed = True
        if allowed:
            return True
        # Any ACL on the resource, even for another principal, turns the default off.
        return not found_acl and self.allow_everyone_if_no_acl_found

    def authorize_by_resource_type(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
    ) -> bool:
        """True if ``principal`` from ``host`` may do ``operation`` on at least one resource of
        ``resource_type`` (KIP-679; Kafka's default ``Authorizer.authorizeByResourceType``):
        a literal ALLOW not cancelled by a literal DENY of the same name or a prefixed DENY of
        one of its prefixes, or a prefixed ALLOW not cancelled by a prefixed DENY of one of its
        prefixes, is enough; a literal DENY of ``"*"`` refuses. Only ACLs for ``operation``
        itself or ALL count here (no implied DESCRIBE). :class:`ValueError` for ``ANY`` /
        ``UNKNOWN`` arguments."""
        if resource_type == ResourceType.ANY:
            raise ValueError("Must specify a non-filter resource type for authorizeByResourceType")
        if resource_type == ResourceType.UNKNOWN:
            raise ValueError("Unknown resource type")
        if operation == AclOperation.ANY:
            raise ValueError("Must specify a non-filter operation type for authorizeByResourceType")
        if operation == AclOperation.UNKNOWN:
            raise ValueError("Unknown operation type")

        if self.authorize(principal, host, operation, resource_type, _HARDCODE_RESOURCE):
            return True

        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allow_literal: set[str] = set()
        allow_prefixed: set[str] = set()
        has_wildcard_allow = False
        # Kafka's default walks every ACL of the type too: this check runs per InitProducerId
        # (KIP-679), not per request.
        for acl in self._index.by_type.get(resource_type, ()):
            if acl.host != host and acl.host != WILDCARD_HOST:
                continue
            if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
                continue
            if acl.operation != operation and acl.operation != AclOperation.ALL:
                continue
            if acl.permission == PermissionType.DENY:
                if acl.pattern_type == PatternType.LITERAL:
                    if acl.resource_name == WILDCARD_RESOURCE:
                        return False
                    deny_literal.add(acl.resource_name)
                elif acl.pattern_type == PatternType.PREFIXED:
                    deny_prefixed.add(acl.resource_name)
            elif acl.permission == PermissionType.ALLOW:
                if acl.pattern_type == PatternType.LITERAL:
                    if acl.resource_name == WILDCARD_RESOURCE:
                        has_wildcard_allow = True
                    else:
                        allow_literal.add(acl.resource_name)
                elif acl.pattern_type == PatternType.PREFIXED:
                    allow_prefixed.add(acl.resource_name)

        if has_wildcard_allow:
            return True

        def denied_by_prefix(name: str) -> bool:
            return any(name[:n] in deny_prefixed for n in range(1, len(name) + 1))

        if any(name not in deny_literal and not denied_by_prefix(name) for name in allow_literal):
            return True
        return any(not denied_by_prefix(name) for name in allow_prefixed)

    def authorized_operations(
        self, principal: str, host: str, resource_type: ResourceType, resource_name: str
    ) -> int:
        """The ``*_authorized_operations`` bit field of Metadata, DescribeGroups and
        DescribeCluster: bit ``op`` set for each operation ``resource_type`` supports that
        ``principal`` from ``host`` may do on ``resource_name``. :class:`ValueError` for a
        resource type that is not concrete."""
        bits = 0
        for op in supported_operations(resource_type):
            if self.authorize(principal, host, op, resource_type, resource_name):
                bits |= 1 << op
        return bits
