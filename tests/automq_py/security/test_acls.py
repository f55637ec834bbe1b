"""The ACL data model: filters, CreateAcls validation, the storage format."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_py.security.acls import (
    ACL_KV_PREFIX,
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    InvalidAclRecordError,
    PatternType,
    PermissionType,
    ResourceType,
    binding_key,
    decode_binding,
    encode_binding,
    supported_operations,
    validate_filter,
    validate_new_binding,
)
from protocol.errors import ErrorCode

ALLOW = PermissionType.ALLOW
DENY = PermissionType.DENY
LITERAL = PatternType.LITERAL
PREFIXED = PatternType.PREFIXED
TOPIC = ResourceType.TOPIC


def topic_acl(
    name: str,
    pattern: PatternType = LITERAL,
    principal: str = "User:alice",
    host: str = "*",
    operation: AclOperation = AclOperation.READ,
    permission: PermissionType = ALLOW,
) -> AclBinding:
    return AclBinding(TOPIC, name, pattern, principal, host, operation, permission)


def test_enums_carry_kafka_wire_codes() -> None:
    assert ResourceType.TRANSACTIONAL_ID == 5 and ResourceType.USER == 7
    assert PatternType.PREFIXED == 4
    assert AclOperation.IDEMPOTENT_WRITE == 12 and AclOperation.DESCRIBE_TOKENS == 14
    assert PermissionType.ALLOW == 3


def test_from_code_maps_unknown_codes_to_unknown() -> None:
    assert ResourceType.from_code(2) is ResourceType.TOPIC
    assert ResourceType.from_code(99) is ResourceType.UNKNOWN
    assert AclOperation.from_code(-1) is AclOperation.UNKNOWN
    assert PermissionType.from_code(3) is PermissionType.ALLOW


def test_filter_any_matches_everything() -> None:
    assert AclBindingFilter.ANY.matches(topic_acl("orders"))
    assert AclBindingFilter.ANY.matches(
        AclBinding(
            ResourceType.CLUSTER,
            CLUSTER_NAME,
            PREFIXED,
            "User:*",
            "10.0.0.1",
            AclOperation.ALL,
            DENY,
        )
    )


def test_filter_resource_type() -> None:
    f = AclBindingFilter(resource_type=ResourceType.GROUP)
    assert not f.matches(topic_acl("orders"))
    assert AclBindingFilter(resource_type=TOPIC).matches(topic_acl("orders"))


def test_filter_literal_matches_same_name_literal_only() -> None:
    f = AclBindingFilter(TOPIC, "orders", LITERAL)
    assert f.matches(topic_acl("orders"))
    assert not f.matches(topic_acl("orders", PREFIXED))
    assert not f.matches(topic_acl("*"))
    assert not f.matches(topic_acl("order", PREFIXED))


def test_filter_prefixed_matches_same_prefix_only() -> None:
    f = AclBindingFilter(TOPIC, "orders-", PREFIXED)
    assert f.matches(topic_acl("orders-", PREFIXED))
    assert not f.matches(topic_acl("orders-", LITERAL))
    assert not f.matches(topic_acl("orders", PREFIXED))


def test_filter_any_pattern_compares_names_as_written() -> None:
    f = AclBindingFilter(TOPIC, "orders", PatternType.ANY)
    assert f.matches(topic_acl("orders"))
    assert f.matches(topic_acl("orders", PREFIXED))
    assert not f.matches(topic_acl("*"))
    assert not f.matches(topic_acl("ord", PREFIXED))
    wildcard = AclBindingFilter(TOPIC, "*", PatternType.ANY)
    assert wildcard.matches(topic_acl("*"))
    assert not wildcard.matches(topic_acl("orders"))


def test_filter_match_finds_every_pattern_that_applies() -> None:
    f = AclBindingFilter(TOPIC, "orders-1", PatternType.MATCH)
    assert f.matches(topic_acl("orders-1"))
    assert f.matches(topic_acl("*"))
    assert f.matches(topic_acl("orders-", PREFIXED))
    assert f.matches(topic_acl("orders-1", PREFIXED))
    assert not f.matches(topic_acl("orders-", LITERAL))
    assert not f.matches(topic_acl("orders-12", PREFIXED))
    assert not f.matches(topic_acl("payments"))


def test_filter_match_without_name_matches_every_pattern() -> None:
    f = AclBindingFilter(TOPIC, None, PatternType.MATCH)
    assert f.matches(topic_acl("orders", PREFIXED))
    assert f.matches(topic_acl("x"))


def test_filter_entry_fields() -> None:
    acl = topic_acl("t", principal="User:bob", host="10.0.0.1", operation=AclOperation.WRITE)
    assert AclBindingFilter(principal="User:bob").matches(acl)
    assert not AclBindingFilter(principal="User:*").matches(acl)
    assert AclBindingFilter(host="10.0.0.1").matches(acl)
    assert not AclBindingFilter(host="*").matches(acl)
    assert AclBindingFilter(operation=AclOperation.WRITE).matches(acl)
    # A filter compares operations as written: ALL is not a wildcard here.
    assert not AclBindingFilter(operation=AclOperation.ALL).matches(acl)
    assert AclBindingFilter(permission=ALLOW).matches(acl)
    assert not AclBindingFilter(permission=DENY).matches(acl)


def test_to_filter_matches_exactly_its_binding() -> None:
    acl = topic_acl("orders", PREFIXED)
    f = acl.to_filter()
    assert f.matches(acl)
    assert f.matches_at_most_one()
    assert not f.matches(topic_acl("orders", LITERAL))


def test_matches_at_most_one() -> None:
    assert not AclBindingFilter.ANY.matches_at_most_one()
    assert AclBindingFilter.ANY.find_indefinite_field() == "Resource type is ANY."
    f = AclBindingFilter(TOPIC, "t", PatternType.MATCH, "User:a", "*", AclOperation.READ, ALLOW)
    assert f.find_indefinite_field() == "Resource pattern type is MATCH."
    f = AclBindingFilter(TOPIC, "t", LITERAL, "User:a", None, AclOperation.READ, ALLOW)
    assert f.find_indefinite_field() == "Host is NULL"


def test_validate_filter_refuses_unknown_parts() -> None:
    assert validate_filter(AclBindingFilter.ANY) == (ErrorCode.NONE, None)
    assert validate_filter(AclBindingFilter(pattern_type=PatternType.UNKNOWN)) == (
        ErrorCode.INVALID_REQUEST,
        "Unknown patternFilter.",
    )
    assert validate_filter(AclBindingFilter(operation=AclOperation.UNKNOWN)) == (
        ErrorCode.INVALID_REQUEST,
        "Unknown entryFilter.",
    )
    assert AclBindingFilter(permission=PermissionType.UNKNOWN).is_unknown()
    assert not AclBindingFilter.ANY.is_unknown()


def test_validate_accepts_a_good_binding() -> None:
    assert validate_new_binding(topic_acl("orders")) == (ErrorCode.NONE, None)
    assert validate_new_binding(topic_acl("*", principal="User:*")) == (ErrorCode.NONE, None)
    cluster = AclBinding(
        ResourceType.CLUSTER, CLUSTER_NAME, LITERAL, "User:a", "*", AclOperation.ALTER, ALLOW
    )
    assert validate_new_binding(cluster) == (ErrorCode.NONE, None)


@pytest.mark.parametrize(
    ("binding", "message"),
    [
        (
            AclBinding(ResourceType.ANY, "t", LITERAL, "User:a", "*", AclOperation.READ, ALLOW),
            "Invalid resourceType ANY",
        ),
        (
            AclBinding(ResourceType.UNKNOWN, "t", LITERAL, "User:a", "*", AclOperation.READ, ALLOW),
            "Invalid resourceType UNKNOWN",
        ),
        (topic_acl("t", PatternType.MATCH), "Invalid patternType MATCH"),
        (topic_acl("t", PatternType.ANY), "Invalid patternType ANY"),
        (topic_acl("t", PatternType.UNKNOWN), "Invalid patternType UNKNOWN"),
        (topic_acl("t", operation=AclOperation.ANY), "Invalid operation ANY"),
        (topic_acl("t", operation=AclOperation.UNKNOWN), "Invalid operation UNKNOWN"),
        (topic_acl("t", permission=PermissionType.ANY), "Invalid permissionType ANY"),
        (topic_acl("t", permission=PermissionType.UNKNOWN), "Invalid permissionType UNKNOWN"),
        (topic_acl(""), "Invalid empty resource name"),
        (topic_acl("", PREFIXED), "Invalid empty resource name"),
        (
            AclBinding(
                ResourceType.CLUSTER, "other", LITERAL, "User:a", "*", AclOperation.ALTER, ALLOW
            ),
            "The only valid name for the CLUSTER resource is kafka-cluster",
        ),
        (
            topic_acl("t", principal="alice"),
            "expected a string in format principalType:principalName but got alice",
        ),
        (
            topic_acl("t", principal=":alice"),
            "expected a string in format principalType:principalName but got :alice",
        ),
    ],
)
def test_validate_refuses_with_invalid_request(binding: AclBinding, message: str) -> None:
    assert validate_new_binding(binding) == (ErrorCode.INVALID_REQUEST, message)


def test_encode_is_canonical_json_with_stable_field_names() -> None:
    acl = topic_acl("orders-", PREFIXED, "User:bob", "10.0.0.1", AclOperation.WRITE, DENY)
    data = encode_binding(acl)
    assert json.loads(data) == {
        "version": 1,
        "resource_type": "TOPIC",
        "resource_name": "orders-",
        "pattern_type": "PREFIXED",
        "principal": "User:bob",
        "host": "10.0.0.1",
        "operation": "WRITE",
        "permission": "DENY",
    }
    assert data == encode_binding(
        topic_acl("orders-", PREFIXED, "User:bob", "10.0.0.1", AclOperation.WRITE, DENY)
    )
    assert decode_binding(data) == acl


def test_binding_key_is_one_key_per_binding() -> None:
    a = topic_acl("orders")
    key = binding_key(a)
    assert key.startswith(ACL_KV_PREFIX)
    assert len(key) == len(ACL_KV_PREFIX) + 64
    assert binding_key(topic_acl("orders")) == key
    assert binding_key(topic_acl("orders", permission=DENY)) != key
    assert binding_key(topic_acl("orders", PREFIXED)) != key


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xfe",
        b"[]",
        b"null",
        b'{"version": 2}',
        b'{"version": true}',
        b"[" * 100_000,
        json.dumps({**json.loads(encode_binding(topic_acl("t"))), "operation": "READS"}).encode(),
        json.dumps({**json.loads(encode_binding(topic_acl("t"))), "host": 7}).encode(),
        json.dumps({**json.loads(encode_binding(topic_acl("t"))), "principal": None}).encode(),
    ],
)
def test_decode_refuses_what_is_not_a_binding(data: bytes) -> None:
    with pytest.raises(InvalidAclRecordError):
        decode_binding(data)


def test_supported_operations() -> None:
    assert supported_operations(ResourceType.TRANSACTIONAL_ID) == {
        AclOperation.DESCRIBE,
        AclOperation.WRITE,
    }
    assert AclOperation.CLUSTER_ACTION in supported_operations(ResourceType.CLUSTER)
    with pytest.raises(ValueError):
        supported_operations(ResourceType.ANY)


bindings = st.builds(
    AclBinding,
    st.sampled_from(ResourceType),
    st.text(),
    st.sampled_from(PatternType),
    st.text(),
    st.text(),
    st.sampled_from(AclOperation),
    st.sampled_from(PermissionType),
)


@given(bindings)
def test_encode_decode_round_trip(binding: AclBinding) -> None:
    data = encode_binding(binding)
    assert decode_binding(data) == binding
    assert encode_binding(decode_binding(data)) == data


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=10,
)
field_names = st.sampled_from(
    [
        "version",
        "resource_type",
        "resource_name",
        "pattern_type",
        "principal",
        "host",
        "operation",
        "permission",
    ]
)


@st.composite
def mutated_encodings(draw: st.DrawFn) -> bytes:
    doc = json.loads(encode_binding(draw(bindings)))
    doc[draw(field_names)] = draw(json_values)
    return json.dumps(doc).encode()


@given(
    st.binary()
    | json_values.map(lambda v: json.dumps(v).encode())
    | mutated_encodings()
    | bindings.map(encode_binding).flatmap(
        lambda data: st.integers(0, len(data)).map(lambda n: data[:n])
    )
)
def test_decode_of_any_bytes_raises_only_value_error(data: bytes) -> None:
    try:
        binding = decode_binding(data)
    except ValueError:
        return
    assert decode_binding(encode_binding(binding)) == binding
