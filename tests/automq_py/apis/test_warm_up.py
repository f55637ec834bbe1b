"""KafkaApis.warm_up loads the hot APIs' schemas a version per loop pass, and asks what a
response names (which reads every version's module) only once all of them are loaded: asked
first, it imported them all in one step, holding the loop for 20-130 ms after the listener
had opened."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

import automq_py.apis as apis_module
from automq_py.apis import KafkaApis
from protocol import build
from protocol.api_keys import ApiKey


async def test_each_step_loads_one_version_and_names_come_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(apis_module, "request_schema", lambda k, v: calls.append(("load", k, v)))
    monkeypatch.setattr(apis_module, "response_schema", lambda k, v: (k, v))
    monkeypatch.setattr(build, "plan", lambda r: calls.append(("load", *r)))
    monkeypatch.setattr(build, "field_names", lambda r: calls.append(("names", *r)))
    apis = KafkaApis(ctx=None)  # type: ignore[arg-type]  # warm_up reads only the table
    keys = (ApiKey.PRODUCE, ApiKey.METADATA)

    async def tick() -> None:
        while True:
            calls.append(("tick",))
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    loaded = await apis.warm_up(keys)
    ticker.cancel()

    versions = [(k, v) for k in keys for v in range(apis.table[k][1], apis.table[k][2] + 1)]
    assert loaded == len(versions) > 2
    steps = [
        {c for c in step}
        for tick, step in itertools.groupby(calls, key=lambda c: c == ("tick",))
        if not tick
    ]
    # a step is one version's request schema and response plan, or one version's names
    assert steps == [{("load", k, v)} for k, v in versions] + [
        {("names", k, v)} for k, v in versions
    ]
