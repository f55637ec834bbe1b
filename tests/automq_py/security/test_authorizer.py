"""StandardAuthorizer: Kafka's ACL semantics, KIP-679 and authorized-operations bit fields."""

from __future__ import annotations

import pytest

from automq_py.security.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from automq_py.security.authorizer import StandardAuthorizer

ALLOW = PermissionType.ALLOW
DENY = PermissionType.DENY
LITERAL = PatternType.LITERAL
PREFIXED = PatternType.PREFIXED
TOPIC = ResourceType.TOPIC
GROUP = ResourceType.GROUP
READ = AclOperation.READ
WRITE = AclOperation.WRITE
DESCRIBE = AclOperation.DESCRIBE
ALICE = "User:alice"
BOB = "User:bob"
HOST = "10.0.0.1"


def acl(
    name: str,
    operation: AclOperation = READ,
    permission: PermissionType = ALLOW,
    pattern: PatternType = LITERAL,
    principal: str = ALICE,
    host: str = "*",
    resource_type: ResourceType = TOPIC,
) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation, permission)


def authorizer(*bindings: AclBinding, allow_everyone: bool = False) -> StandardAuthorizer:
    a = StandardAuthorizer(
        super_users=["User:admin"], allow_everyone_if_no_acl_found=allow_everyone
    )
    a.load(bindings)
    return a


def can(
    a: StandardAuthorizer,
    operation: AclOperation,
    name: str,
    principal: str = ALICE,
    host: str = HOST,
    resource_type: ResourceType = TOPIC,
) -> bool:
    return a.authorize(principal, host, operation, resource_type, name)


def test_literal_allow() -> None:
    a = authorizer(acl("orders"))
    assert can(a, READ, "orders")
    assert not can(a, WRITE, "orders")
    assert not can(a, READ, "orders", principal=BOB)
    assert not can(a, READ, "orders", resource_type=GROUP)


def test_deny_wins_over_allow() -> None:
    a = authorizer(acl("orders"), acl("orders", permission=DENY))
    assert not can(a, READ, "orders")
    a = authorizer(acl("*"), acl("orders-", permission=DENY, pattern=PREFIXED))
    assert not can(a, READ, "orders-1")
    assert can(a, READ, "payments")


def test_allow_implies_describe_but_deny_implies_nothing() -> None:
    for op in (READ, WRITE, AclOperation.DELETE, AclOperation.ALTER):
        assert can(authorizer(acl("t", op)), DESCRIBE, "t")
    assert not can(authorizer(acl("t", AclOperation.CREATE)), DESCRIBE, "t")
    a = authorizer(acl("t", AclOperation.ALTER_CONFIGS))
    assert can(a, AclOperation.DESCRIBE_CONFIGS, "t")
    assert not can(a, AclOperation.ALTER, "t")
    # DENY READ does not deny DESCRIBE, which an ALLOW WRITE grants.
    a = authorizer(acl("t", READ, DENY), acl("t", WRITE))
    assert not can(a, READ, "t")
    assert can(a, DESCRIBE, "t")
    # DENY READ alone: the resource has an ACL, so DESCRIBE is not defaulted in.
    assert not can(authorizer(acl("t", READ, DENY), allow_everyone=True), DESCRIBE, "t")


def test_all_operation() -> None:
    a = authorizer(acl("t", AclOperation.ALL))
    assert can(a, READ, "t") and can(a, AclOperation.ALTER_CONFIGS, "t")
    a = authorizer(acl("t", AclOperation.ALL), acl("t", AclOperation.ALL, DENY, principal=BOB))
    assert can(a, WRITE, "t")
    assert not can(a, DESCRIBE, "t", principal=BOB)
    a = authorizer(acl("*", AclOperation.ALL), acl("t", AclOperation.ALL, DENY))
    assert not can(a, READ, "t")
    assert can(a, READ, "u")


def test_wildcard_principal_host_and_resource() -> None:
    a = authorizer(acl("t", principal="User:*"))
    assert can(a, READ, "t", principal=BOB)
    # Only User:* is the wildcard principal.
    assert not can(authorizer(acl("t", principal="Group:*")), READ, "t", principal="Group:x")
    a = authorizer(acl("t", host=HOST))
    assert can(a, READ, "t", host=HOST)
    assert not can(a, READ, "t", host="10.0.0.2")
    a = authorizer(acl("*"))
    assert can(a, READ, "anything")
    assert can(a, READ, "*")
    a = authorizer(acl("*", permission=DENY, principal="User:*"), acl("t"))
    assert not can(a, READ, "t")


def test_prefixed() -> None:
    a = authorizer(acl("orders-", pattern=PREFIXED))
    assert can(a, READ, "orders-1")
    assert can(a, READ, "orders-")
    assert not can(a, READ, "orders")
    assert not can(a, READ, "payments")


def test_prefixes_of_several_lengths_and_literal_prefix_of_name() -> None:
    a = authorizer(
        acl("o", pattern=PREFIXED, operation=WRITE),
        acl("orders-eu-", pattern=PREFIXED),
        acl("orders"),  # a literal whose name is a prefix of "orders-eu-1" does not apply
        acl("orders-eu-1-x", pattern=PREFIXED, permission=DENY),
    )
    assert can(a, READ, "orders-eu-1")
    assert can(a, WRITE, "orders-eu-1")
    assert not can(a, READ, "orders-us-1")
    assert not can(a, READ, "orders-eu-1-xy")


def test_super_users_are_always_allowed() -> None:
    a = authorizer(acl("t", AclOperation.ALL, DENY, principal="User:*"))
    assert can(a, READ, "t", principal="User:admin")
    assert can(
        a, AclOperation.CLUSTER_ACTION, CLUSTER_NAME, "User:admin", "h", ResourceType.CLUSTER
    )
    with pytest.raises(ValueError):
        StandardAuthorizer(super_users=["admin"])


def test_allow_everyone_if_no_acl_found() -> None:
    assert not can(authorizer(), READ, "t")
    assert can(authorizer(allow_everyone=True), READ, "t")
    # An ACL on the resource for someone else switches the default off for everyone.
    a = authorizer(acl("t", principal=BOB), allow_everyone=True)
    assert not can(a, READ, "t")
    assert can(a, READ, "u")
    # Wildcard and prefixed ACLs are ACLs on the resource too.
    a = authorizer(acl("*", principal=BOB), allow_everyone=True)
    assert not can(a, READ, "u")
    a = authorizer(acl("t-", pattern=PREFIXED, principal=BOB), allow_everyone=True)
    assert not can(a, READ, "t-1")
    assert can(a, READ, "t")
    # Without allow.everyone, a resource with ACLs still needs a matching ALLOW.
    assert not can(authorizer(acl("t", principal=BOB)), READ, "t")


def test_load_replaces_and_deduplicates() -> None:
    a = authorizer(acl("t"), acl("t"), acl("u"))
    assert a.bindings() == [acl("t"), acl("u")]
    a.load([acl("v")])
    assert a.bindings() == [acl("v")]
    assert not can(a, READ, "t")
    assert can(a, READ, "v")


def test_describe() -> None:
    bindings = [
        acl("orders-1"),
        acl("orders-", pattern=PREFIXED),
        acl("*"),
        acl("payments"),
        acl("g", resource_type=GROUP),
    ]
    a = authorizer(*bindings)
    assert a.describe(AclBindingFilter.ANY) == bindings
    assert a.describe(AclBindingFilter(resource_type=GROUP)) == [bindings[4]]
    match = AclBindingFilter(TOPIC, "orders-1", PatternType.MATCH)
    assert a.describe(match) == bindings[:3]
    assert a.describe(AclBindingFilter(TOPIC, "*", PatternType.ANY)) == [bindings[2]]


# KIP-679: may the principal do the operation on at least one resource of the type?


def by_type(
    a: StandardAuthorizer,
    operation: AclOperation = WRITE,
    principal: str = ALICE,
    host: str = HOST,
) -> bool:
    return a.authorize_by_resource_type(principal, host, operation, TOPIC)


def test_by_resource_type_no_acls() -> None:
    assert not by_type(authorizer())
    assert by_type(authorizer(allow_everyone=True))


def test_by_resource_type_literal_allow() -> None:
    assert by_type(authorizer(acl("t1", WRITE)))
    assert not by_type(authorizer(acl("t1", WRITE)), principal=BOB)
    assert by_type(authorizer(acl("t1", WRITE, principal="User:*")), principal=BOB)
    assert not by_type(authorizer(acl("t1", WRITE, host="10.9.9.9")))
    assert by_type(authorizer(acl("t1", AclOperation.ALL)))
    # No implied operations here: ALLOW WRITE on t1 does not count for DESCRIBE.
    assert not by_type(authorizer(acl("t1", WRITE)), DESCRIBE)


def test_by_resource_type_literal_allow_cancelled_by_deny() -> None:
    assert not by_type(authorizer(acl("t1", WRITE), acl("t1", WRITE, DENY)))
    assert not by_type(authorizer(acl("t1", WRITE), acl("t", WRITE, DENY, PREFIXED)))
    assert by_type(authorizer(acl("t1", WRITE), acl("t", WRITE, DENY)))
    assert by_type(authorizer(acl("t1", WRITE), acl("t1", WRITE, DENY), acl("t2", WRITE)))


def test_by_resource_type_prefixed_allow() -> None:
    assert by_type(authorizer(acl("abc", WRITE, pattern=PREFIXED)))
    assert not by_type(
        authorizer(acl("abc", WRITE, pattern=PREFIXED), acl("ab", WRITE, DENY, PREFIXED))
    )
    assert by_type(
        authorizer(acl("abc", WRITE, pattern=PREFIXED), acl("abcd", WRITE, DENY, PREFIXED))
    )
    # A literal DENY does not cancel a prefixed ALLOW: "abcx" is still writable.
    assert by_type(authorizer(acl("abc", WRITE, pattern=PREFIXED), acl("abc", WRITE, DENY)))


def test_by_resource_type_wildcards() -> None:
    assert by_type(authorizer(acl("*", WRITE)))
    assert not by_type(authorizer(acl("t1", WRITE), acl("*", WRITE, DENY)))
    assert not by_type(
        authorizer(acl("t1", WRITE), acl("*", AclOperation.ALL, DENY, principal="User:*"))
    )
    # The wildcard ALLOW wins even where a prefixed DENY covers the probe name "hardcode".
    assert by_type(authorizer(acl("*", WRITE), acl("hard", WRITE, DENY, PREFIXED)))


def test_by_resource_type_super_user_and_default() -> None:
    a = authorizer(acl("*", WRITE, DENY, principal="User:*"))
    assert by_type(a, principal="User:admin")
    # As in Kafka: allow.everyone.if.no.acl.found applies through the made-up resource
    # "hardcode", so ACLs on other topics for other principals do not switch it off.
    assert by_type(authorizer(acl("t1", WRITE, principal=BOB), allow_everyone=True))
    assert not by_type(
        authorizer(acl("h", WRITE, principal=BOB, pattern=PREFIXED), allow_everyone=True)
    )


def test_by_resource_type_refuses_filter_values() -> None:
    a = authorizer()
    with pytest.raises(ValueError):
        a.authorize_by_resource_type(ALICE, HOST, WRITE, ResourceType.ANY)
    with pytest.raises(ValueError):
        a.authorize_by_resource_type(ALICE, HOST, AclOperation.ANY, TOPIC)
    with pytest.raises(ValueError):
        a.authorize_by_resource_type(ALICE, HOST, AclOperation.UNKNOWN, TOPIC)


def bits(*ops: AclOperation) -> int:
    return sum(1 << op for op in set(ops))


TOPIC_OPS = (
    READ,
    WRITE,
    AclOperation.CREATE,
    AclOperation.DELETE,
    AclOperation.ALTER,
    DESCRIBE,
    AclOperation.DESCRIBE_CONFIGS,
    AclOperation.ALTER_CONFIGS,
)


def test_authorized_operations_topic() -> None:
    a = authorizer(acl("t", READ), acl("t", AclOperation.ALTER_CONFIGS))
    assert a.authorized_operations(ALICE, HOST, TOPIC, "t") == bits(
        READ, DESCRIBE, AclOperation.ALTER_CONFIGS, AclOperation.DESCRIBE_CONFIGS
    )
    assert a.authorized_operations(BOB, HOST, TOPIC, "t") == 0
    assert a.authorized_operations("User:admin", HOST, TOPIC, "t") == bits(*TOPIC_OPS)
    assert authorizer(allow_everyone=True).authorized_operations(BOB, HOST, TOPIC, "t") == bits(
        *TOPIC_OPS
    )


def test_authorized_operations_group_cluster_transactional_id() -> None:
    a = authorizer(
        acl("g", AclOperation.ALL, resource_type=GROUP),
        acl(CLUSTER_NAME, AclOperation.IDEMPOTENT_WRITE, resource_type=ResourceType.CLUSTER),
        acl("tx", WRITE, resource_type=ResourceType.TRANSACTIONAL_ID),
    )
    assert a.authorized_operations(ALICE, HOST, GROUP, "g") == bits(
        READ,
        DESCRIBE,
        AclOperation.DELETE,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    )
    assert a.authorized_operations(ALICE, HOST, ResourceType.CLUSTER, CLUSTER_NAME) == bits(
        AclOperation.IDEMPOTENT_WRITE
    )
    assert a.authorized_operations(ALICE, HOST, ResourceType.TRANSACTIONAL_ID, "tx") == bits(
        WRITE, DESCRIBE
    )
    with pytest.raises(ValueError):
        a.authorized_operations(ALICE, HOST, ResourceType.ANY, "x")
