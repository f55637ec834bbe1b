"""Which Produce requests read together are handled as one append (``joins_batch``): the
rule alone, on stand-ins for the broker context and the decoded requests."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from automq_py.apis.produce import joins_batch


def request(acks: int = -1, timeout_ms: int = 30000, transactional_id: str | None = None) -> Any:
    body = SimpleNamespace(acks=acks, timeout_ms=timeout_ms, transactional_id=transactional_id)
    return SimpleNamespace(body=body)


def context(quotas_in_force: bool | None = False) -> Any:
    quotas = None if quotas_in_force is None else SimpleNamespace(any=quotas_in_force)
    return SimpleNamespace(quotas=quotas)


@pytest.mark.parametrize("acks", [-1, 1])
@pytest.mark.parametrize("quotas", [None, False])
def test_requests_that_wait_alike_join(acks: int, quotas: bool | None) -> None:
    first = request(acks)
    assert joins_batch(context(quotas), first, first)
    assert joins_batch(context(quotas), first, request(acks))


@pytest.mark.parametrize(
    ("first", "other"),
    [
        (request(-1), request(1)),  # answered after different waits
        (request(1), request(-1)),
        (request(-1, 30000), request(-1, 5000)),  # timed out apart
        (request(0), request(0)),  # no response to give
        (request(-1), request(-1, transactional_id="t")),  # verified per request
        (request(-1, transactional_id="t"), request(-1)),
    ],
)
def test_requests_that_differ_do_not_join(first: Any, other: Any) -> None:
    assert not joins_batch(context(), first, other)


def test_nothing_joins_while_a_quota_is_in_force() -> None:
    first = request()
    assert not joins_batch(context(True), first, first)
    assert not joins_batch(context(True), first, request())
