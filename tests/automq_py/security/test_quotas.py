"""Client quota configs and throttling, as pure logic: Kafka's entity matching order, the
AlterClientQuotas and DescribeClientQuotas rules, the token bucket and the throttle time."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from automq_py.security import quota_configs as qc
from automq_py.security.quotas import FETCH, PRODUCE, REQUEST, ClientQuotas, TokenBucket
from protocol.errors import ErrorCode
from storage.metadata import records as rec


def test_keys_round_trip_with_sanitized_names_and_defaults() -> None:
    for entity in [
        ((qc.USER, "alice"),),
        ((qc.USER, None), (qc.CLIENT_ID, "a/b <default>")),
        ((qc.CLIENT_ID, None),),
        ((qc.USER, "x y%"), (qc.CLIENT_ID, None)),
    ]:
        key = qc.entity_key(entity)
        assert key.startswith(qc.KV_PREFIX)
        assert qc.parse_key(key) == entity
    assert qc.entity_key(((qc.USER, None),)) == "quota/users/<default>"
    with pytest.raises(ValueError):
        qc.parse_key("quota/groups/x")


def apply(kv: dict[str, bytes], records: Sequence[rec.Record]) -> None:
    for r in records:
        if isinstance(r, rec.KVRecord):
            kv[r.key] = r.value
        elif isinstance(r, rec.RemoveKV):
            kv.pop(r.key, None)


def alter(
    kv: dict[str, bytes], entity: list[tuple[str, str | None]], **values: float | None
) -> None:
    ops = [qc.Op(k, v or 0.0, v is None) for k, v in values.items()]
    records, results = qc.plan_alter(kv, [qc.Alteration(entity, ops)], validate_only=False)
    assert results == [(ErrorCode.NONE, None)]
    apply(kv, records)


def test_alter_sets_merges_and_removes() -> None:
    kv: dict[str, bytes] = {}
    alter(kv, [(qc.USER, "alice")], producer_byte_rate=1024)
    alter(kv, [(qc.USER, "alice")], consumer_byte_rate=2048)
    assert json.loads(kv["quota/users/alice"]) == {
        "consumer_byte_rate": 2048,
        "producer_byte_rate": 1024,
    }
    alter(kv, [(qc.USER, "alice")], producer_byte_rate=None, consumer_byte_rate=None)
    assert kv == {}


@pytest.mark.parametrize(
    ("entity", "ops", "message"),
    [
        ([], [qc.Op("producer_byte_rate", 1, False)], "empty"),
        ([("ip", "1.2.3.4")], [qc.Op("producer_byte_rate", 1, False)], "entity type"),
        ([(qc.USER, "a"), (qc.USER, "b")], [], "Duplicate entity type"),
        ([(qc.USER, "a")], [qc.Op("bogus", 1, False)], "Invalid configuration key"),
        ([(qc.USER, "a")], [qc.Op("producer_byte_rate", -1, False)], "positive"),
        ([(qc.USER, "a")], [qc.Op("producer_byte_rate", 1.5, False)], "must be a Long value"),
        ([(qc.USER, "a")], [qc.Op("producer_byte_rate", math.inf, False)], "a Long value"),
        ([(qc.USER, "a")], [qc.Op("request_percentage", math.nan, False)], "positive"),
        ([(qc.USER, "a")], [qc.Op("request_percentage", 1, False)] * 2, "Duplicate quota key"),
    ],
)
def test_bad_alterations_are_refused_alone(
    entity: list[tuple[str, str | None]], ops: list[qc.Op], message: str
) -> None:
    good = qc.Alteration([(qc.CLIENT_ID, "ok")], [qc.Op("producer_byte_rate", 5, False)])
    records, results = qc.plan_alter({}, [qc.Alteration(entity, ops), good], validate_only=False)
    assert results[0][0] == ErrorCode.INVALID_REQUEST and message in str(results[0][1])
    assert results[1] == (ErrorCode.NONE, None)
    assert [r.key for r in records if isinstance(r, rec.KVRecord)] == ["quota/clients/ok"]


def test_an_entity_is_altered_once_a_request_and_removing_what_is_not_set_is_no_error() -> None:
    """As Kafka's ClientQuotaControlManager: the second alteration of an entity in one
    request is refused ("Ignoring duplicate entity"), the first made; a removal is not
    checked against the quota keys (removing what is not there changes nothing)."""
    first = qc.Alteration([(qc.USER, "a")], [qc.Op("producer_byte_rate", 5, False)])
    again = qc.Alteration([(qc.USER, "a")], [qc.Op("consumer_byte_rate", 7, False)])
    gone = qc.Alteration([(qc.USER, "b")], [qc.Op("no_such_key", 0, True)])
    records, results = qc.plan_alter({}, [first, again, gone], validate_only=False)
    assert results[0] == (ErrorCode.NONE, None) and results[2] == (ErrorCode.NONE, None)
    assert results[1][0] == ErrorCode.INVALID_REQUEST
    assert "Ignoring duplicate entity" in str(results[1][1])
    assert [(r.key, json.loads(r.value)) for r in records if isinstance(r, rec.KVRecord)] == [
        ("quota/users/a", {"producer_byte_rate": 5})
    ]


def test_validate_only_changes_nothing() -> None:
    ok = qc.Alteration([(qc.USER, "a")], [qc.Op("producer_byte_rate", 5, False)])
    records, results = qc.plan_alter({}, [ok], validate_only=True)
    assert records == [] and results == [(ErrorCode.NONE, None)]


def test_describe_filters_as_kafka() -> None:
    kv: dict[str, bytes] = {}
    alter(kv, [(qc.USER, "alice")], producer_byte_rate=1)
    alter(kv, [(qc.USER, None)], producer_byte_rate=2)
    alter(kv, [(qc.USER, "alice"), (qc.CLIENT_ID, "app")], producer_byte_rate=3)
    alter(kv, [(qc.CLIENT_ID, "app")], producer_byte_rate=4)

    def names(*components: qc.Component, strict: bool = False) -> list[qc.Entity]:
        code, _, found = qc.describe(kv, list(components), strict)
        assert code == ErrorCode.NONE
        return [entity for entity, _ in found]

    exact = qc.Component(qc.USER, qc.MATCH_EXACT, "alice")
    assert names(exact) == [((qc.USER, "alice"),), ((qc.USER, "alice"), (qc.CLIENT_ID, "app"))]
    assert names(exact, strict=True) == [((qc.USER, "alice"),)]
    assert names(qc.Component(qc.USER, qc.MATCH_DEFAULT, None)) == [((qc.USER, None),)]
    # any entity of the type: the default one too (Kafka's TypeMatch)
    specified = names(qc.Component(qc.USER, qc.MATCH_SPECIFIED, None), strict=True)
    assert specified == [((qc.USER, None),), ((qc.USER, "alice"),)]
    assert len(names()) == 4  # no components: everything
    assert names(qc.Component(qc.IP, qc.MATCH_SPECIFIED, None)) == []  # none kept

    def refused(*components: qc.Component) -> tuple[ErrorCode, str]:
        code, message, found = qc.describe(kv, list(components), False)
        assert found == []
        return code, str(message)

    invalid = ErrorCode.INVALID_REQUEST
    assert refused(exact, exact) == (invalid, "Duplicate user filter component entity type")
    assert refused(qc.Component("", 2, None))[0] == invalid
    assert refused(qc.Component("group", 2, None)) == (
        ErrorCode.UNSUPPORTED_VERSION,
        "Custom entity type group not supported",
    )
    assert refused(qc.Component(qc.USER, qc.MATCH_EXACT, None))[0] == invalid
    assert refused(qc.Component(qc.USER, qc.MATCH_DEFAULT, "alice"))[0] == invalid
    assert refused(qc.Component(qc.USER, qc.MATCH_SPECIFIED, "alice"))[0] == invalid
    code, message = refused(
        qc.Component(qc.IP, qc.MATCH_SPECIFIED, None), qc.Component(qc.USER, 2, None)
    )
    assert code == invalid and message.startswith("Invalid entity filter component combination")


@dataclass
class Metadata:
    """What ClientQuotas reads of the metadata manager: the KV image and KV change
    listeners."""

    kv: dict[str, bytes] = field(default_factory=dict)
    listeners: list[tuple[str, Callable[[], None]]] = field(default_factory=list)

    @property
    def image(self) -> Any:
        return self

    def add_kv_listener(self, prefix: str, listener: Callable[[], None]) -> None:
        self.listeners.append((prefix, listener))

    def change(self, entity: list[tuple[str, str | None]], **values: float | None) -> None:
        before = dict(self.kv)
        alter(self.kv, entity, **values)
        changed = [rec.KVRecord(k, v) for k, v in self.kv.items() if before.get(k) != v]
        changed += [rec.RemoveKV(k) for k in before if k not in self.kv]
        for prefix, listener in self.listeners:
            if any(
                isinstance(r, (rec.KVRecord, rec.RemoveKV)) and r.key.startswith(prefix)
                for r in changed
            ):
                listener()


def quotas(metadata: Metadata, now: list[float]) -> ClientQuotas:
    return ClientQuotas(cast(Any, metadata), 11, 1, clock=lambda: now[0])


def test_the_most_specific_entity_setting_the_key_wins_and_its_clients_share_it() -> None:
    metadata, now = Metadata(), [100.0]
    q = quotas(metadata, now)
    metadata.change([(qc.USER, None)], producer_byte_rate=100)
    metadata.change([(qc.USER, "alice")], consumer_byte_rate=200)
    metadata.change([(qc.CLIENT_ID, "app")], producer_byte_rate=300, request_percentage=50)
    assert q.limit(PRODUCE, "alice", "app") == 100  # <default> user beats the client id
    assert q.limit(FETCH, "alice", "app") == 200
    assert q.limit(REQUEST, "alice", "app") == 50  # only the client id sets it
    assert q.limit(FETCH, "bob", "app") is None
    metadata.change([(qc.USER, "alice"), (qc.CLIENT_ID, "app")], producer_byte_rate=7)
    assert q.limit(PRODUCE, "alice", "app") == 7  # re-read on change
    # bob's two clients share the default user's limit: bytes of one throttle the other
    assert q.record(PRODUCE, "bob", "one", 100) == 0  # one window's worth
    assert q.record(PRODUCE, "bob", "two", 1) > 0


def test_throttle_time_pays_the_debt_back_at_the_limit() -> None:
    metadata, now = Metadata(), [0.0]
    q = quotas(metadata, now)
    metadata.change([(qc.USER, "u")], producer_byte_rate=1000)
    # the bucket holds one window (1 s) of the limit: 1000 B pass, the next 4000 are a debt
    # that takes 4 s to pay back at 1000 B/s
    assert q.record(PRODUCE, "u", "c", 1000) == 0
    assert q.record(PRODUCE, "u", "c", 4000) == 4000
    now[0] = 2.0
    assert q.record(PRODUCE, "u", "c", 0) == 2000  # half paid
    now[0] = 30.0  # long after: a full bucket again, no more
    assert q.record(PRODUCE, "u", "c", 1000) == 0
    assert q.record(PRODUCE, "u", "c", 1) == 1
    # a throttle is at most quota.window.num windows (11 s), though the debt stays
    assert q.record(PRODUCE, "u", "c", 10**6) == 11_000


def test_a_changed_limit_takes_effect_on_the_sensor() -> None:
    metadata, now = Metadata(), [0.0]
    q = quotas(metadata, now)
    metadata.change([(qc.CLIENT_ID, "c")], producer_byte_rate=1000)
    assert q.record(PRODUCE, "u", "c", 3000) == 2000
    metadata.change([(qc.CLIENT_ID, "c")], producer_byte_rate=2000)
    assert q.record(PRODUCE, "u", "c", 0) == 1000  # the same debt, paid twice as fast


def test_request_quotas_count_handling_time_as_percent_of_a_core() -> None:
    metadata, now = Metadata(), [0.0]
    q = quotas(metadata, now)
    metadata.change([(qc.USER, None)], request_percentage=50)  # 500 ms of handling per s
    assert q.record(REQUEST, "u", "c", 500) == 0
    assert q.record(REQUEST, "u", "c", 250) == 500


def test_no_quota_records_nothing() -> None:
    metadata, now = Metadata(), [0.0]
    q = quotas(metadata, now)
    assert not q.any
    assert q.record(PRODUCE, "u", "c", 10**12) == 0


def test_token_bucket() -> None:
    bucket = TokenBucket(rate=100, capacity=100, tokens=100, updated_s=0)
    assert bucket.record(100, 0) == 0
    assert bucket.record(50, 0) == pytest.approx(0.5)
    assert bucket.record(-50, 0) == 0  # given back
    assert bucket.record(0, 10) == 0 and bucket.tokens == 100  # full, not more


def test_a_strict_mutation_quota_refuses_only_while_in_debt() -> None:
    """KIP-599 as Kafka's StrictControllerMutationQuota: the bucket holds 11 windows of the
    rate; a request is checked before it is recorded, so one that finds credit may take the
    bucket deep into debt, and the next is refused, nothing taken, for the debt's time."""
    metadata, now = Metadata(), [0.0]
    q = quotas(metadata, now)
    metadata.change([(qc.CLIENT_ID, "admin")], controller_mutation_rate=2)  # burst: 22
    assert q.take_mutations("u", "admin", 20, strict=True) == (True, 0)
    assert q.take_mutations("u", "admin", 10, strict=True) == (True, 0)  # 2 left: taken
    assert q.take_mutations("u", "admin", 1, strict=True) == (False, 4000)  # 8 owed at 2/s
    now[0] = 4.0
    assert q.take_mutations("u", "admin", 1, strict=True) == (True, 0)
    # an older request version is never refused: taken, and throttled for the debt
    assert q.take_mutations("u", "admin", 5, strict=False) == (True, 3000)
    assert q.take_mutations("u", "other", 10**6, strict=True) == (True, 0)  # no quota
