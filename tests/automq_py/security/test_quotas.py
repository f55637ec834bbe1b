"""Client quota configs and throttling, as pure logic: Kafka's entity matching order, the
AlterClientQuotas and DescribeClientQuotas rules, the sampled rate and the throttle time."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from automq_py.security import quota_configs as qc
from automq_py.security.quotas import FETCH, PRODUCE, REQUEST, ClientQuotas, Rate
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
        ([(qc.USER, "a")], [qc.Op("producer_byte_rate", 1.5, False)], "whole number"),
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
    specified = names(qc.Component(qc.USER, qc.MATCH_SPECIFIED, None), strict=True)
    assert specified == [((qc.USER, "alice"),)]
    assert len(names()) == 4  # no components: everything
    code, _, _ = qc.describe(kv, [exact, exact], False)
    assert code == ErrorCode.INVALID_REQUEST


@dataclass
class Metadata:
    """What ClientQuotas reads of the metadata manager: the KV image and change listeners."""

    kv: dict[str, bytes] = field(default_factory=dict)
    listeners: list[Callable[[Sequence[rec.Record]], None]] = field(default_factory=list)

    @property
    def image(self) -> Any:
        return self

    def add_listener(self, listener: Callable[[Sequence[rec.Record]], None]) -> None:
        self.listeners.append(listener)

    def change(self, entity: list[tuple[str, str | None]], **values: float | None) -> None:
        before = dict(self.kv)
        alter(self.kv, entity, **values)
        changed = [rec.KVRecord(k, v) for k, v in self.kv.items() if before.get(k) != v]
        changed += [rec.RemoveKV(k) for k in before if k not in self.kv]
        for listener in self.listeners:
            listener(changed)


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
    assert q.record(PRODUCE, "bob", "one", 1000) == 0  # 1000 B over 10 s: 100 B/s
    assert q.record(PRODUCE, "bob", "two", 1) > 0


def test_throttle_time_brings_the_rate_back_to_the_limit() -> None:
    metadata, now = Metadata(), [0.0]
    q = quotas(metadata, now)
    metadata.change([(qc.USER, "u")], producer_byte_rate=1000)
    # 20,000 B in the first second: measured over 10 s (samples - 1 whole windows) is 2000 B/s,
    # twice the limit: the client waits as long again as the window, ~10 s
    throttle = q.record(PRODUCE, "u", "c", 20_000)
    assert throttle == pytest.approx(10_000, rel=0.01)
    now[0] = 30.0  # long after: the window forgot it
    assert q.record(PRODUCE, "u", "c", 100) == 0


def test_no_quota_records_nothing() -> None:
    metadata, now = Metadata(), [0.0]
    q = quotas(metadata, now)
    assert not q.any
    assert q.record(PRODUCE, "u", "c", 10**12) == 0


def test_rate_over_its_samples() -> None:
    rate = Rate(samples=3, window_ms=1000)
    rate.record(300, 0)
    assert rate.measure(0) == pytest.approx(150)  # at least 2 whole windows
    rate.record(300, 1500)
    assert rate.measure(2500) == pytest.approx(600 / 2.5)
    assert rate.measure(10_000) == 0
