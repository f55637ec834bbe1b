"""Random sequences of metadata operations keep the metadata's invariants (hypothesis).

The machine plays nodes that register, create/open/close/trim/delete streams, upload,
retry commits, compact Stream Set Objects and Stream Objects, expire and delete objects, with
some stale epochs and wrong offsets mixed in. After every step the image must agree with the
store and with itself; a refused operation must change nothing.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Coroutine
from typing import Any, TypeVar

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from storage.metadata.image import MetadataImage
from storage.metadata.manager import MetadataManager
from storage.metadata.model import (
    CommitRange,
    CommitStreamObject,
    MetadataError,
    ObjectState,
)
from storage.object_format import StreamOffsetRange
from tests.storage.metadata.helpers import TTL_MS, FakeClock

T = TypeVar("T")
NODES = (1, 2, 3)


class MetadataMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.m = self.run(MetadataManager.open("sqlite://:memory:", clock=self.clock))
        self.epochs: dict[int, int] = {}
        self.last_commit: tuple[Any, ...] | None = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def attempt(self, coro: Coroutine[Any, Any, Any], label: str = "") -> bool:
        """Run an operation that may be refused; a refusal must leave everything unchanged."""
        before = copy.deepcopy(self.m.image)
        name = label or str(getattr(coro, "__qualname__", "")).removeprefix("MetadataManager.")
        try:
            self.run(coro)
        except MetadataError as e:
            event(f"{name}: {e.code.name}")
            assert self.m.image == before
            return False
        event(f"{name}: ok")
        return True

    def teardown(self) -> None:
        self.run(self.m.close())
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()

    @property
    def image(self) -> MetadataImage:
        return self.m.image

    # -- rules -----------------------------------------------------------------------------------

    @initialize()
    def nodes_with_open_streams(self) -> None:
        for node in NODES:
            self.epochs[node] = self.run(self.m.register_node(node))
            stream_id = self.run(self.m.create_stream(node, self.epochs[node]))
            self.run(self.m.open_stream(node, self.epochs[node], stream_id, 0))

    @rule(node=st.sampled_from(NODES))
    def register(self, node: int) -> None:
        self.epochs[node] = self.run(self.m.register_node(node))

    @precondition(lambda self: self.epochs)
    @rule(data=st.data())
    def create(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(sorted(self.epochs)))
        self.run(self.m.create_stream(node, self.epochs[node]))

    @precondition(lambda self: self.epochs and self.image.streams)
    @rule(data=st.data())
    def open(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(sorted(self.epochs)))
        stream = data.draw(st.sampled_from(sorted(self.image.streams.values(), key=_id)))
        epoch = max(0, stream.epoch + data.draw(st.sampled_from([1, 1, 0, -1])))
        node_epoch = self.epochs[node] - data.draw(st.sampled_from([0, 0, 0, 1]))
        self.attempt(self.m.open_stream(node, node_epoch, stream.stream_id, epoch))

    @precondition(lambda self: any(s.ranges for s in self.image.streams.values()))
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        stream = data.draw(st.sampled_from(_opened_ever(self.image)))
        node = data.draw(st.sampled_from([stream.ranges[-1].node_id, *NODES]))
        self.attempt(
            self.m.close_stream(node, self.epochs.get(node, 0), stream.stream_id, stream.epoch)
        )

    @precondition(lambda self: self.epochs)
    @rule(data=st.data())
    def upload_again(self, data: st.DataObject) -> None:
        """Uploads are most of a broker's metadata traffic: draw them twice as often."""
        self.upload(data)

    @precondition(lambda self: self.epochs)
    @rule(data=st.data())
    def upload(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(sorted(self.epochs)))
        mine = self.m.streams_opened_by(node)
        if not mine:
            return
        chosen = data.draw(st.lists(st.sampled_from(mine), min_size=1, unique_by=_id))
        ranges: list[CommitRange] = []
        sos: list[tuple[int, int, int]] = []
        for s in chosen:
            length = data.draw(st.integers(1, 20))
            # now and then a writer that lost track of the end or of its epoch
            start = s.end_offset + data.draw(st.sampled_from([0, 0, 0, 0, 0, 0, 1]))
            epoch = s.epoch - data.draw(st.sampled_from([0, 0, 0, 0, 0, 1]))
            if data.draw(st.booleans()):
                ranges.append(CommitRange(s.stream_id, epoch, start, start + length))
            else:
                sos.append((s.stream_id, start, start + length))
        count = len(sos) + (1 if ranges else 0)
        first = self.run(self.m.prepare_object(count, TTL_MS))
        sso_id = first + len(sos) if ranges else -1
        args = (
            node,
            self.epochs[node],
            sso_id,
            sso_id,
            data.draw(st.integers(0, 10_000)),
            ranges,
            [CommitStreamObject(first + i, *so, 10 + i) for i, so in enumerate(sos)],
        )
        if self.attempt(self.m.commit_stream_set_object(*args), "upload"):
            self.last_commit = args

    @precondition(lambda self: self.last_commit is not None)
    @rule()
    def retry_last_commit(self) -> None:
        assert self.last_commit is not None
        node, node_epoch = self.last_commit[0], self.last_commit[1]
        if self.epochs[node] != node_epoch:
            return  # the node restarted since: its retry would be fenced, rightly
        before = copy.deepcopy(self.image)
        ok = self.attempt(self.m.commit_stream_set_object(*self.last_commit), "retry")
        # a retry changes nothing; it fails only if the objects moved on since (compacted)
        assert self.image == before
        if not ok:
            self.last_commit = None

    @precondition(lambda self: any(n.stream_set_objects for n in self.image.nodes.values()))
    @rule(data=st.data())
    def compact_stream_set_objects(self, data: st.DataObject) -> None:
        nodes = [n for n in self.image.nodes.values() if n.stream_set_objects]
        node = data.draw(st.sampled_from(sorted(nodes, key=lambda n: n.node_id)))
        if node.node_id not in self.epochs:
            return
        compacted = data.draw(
            st.lists(st.sampled_from(node.stream_set_objects), min_size=1, unique=True)
        )
        merged = _merge_adjacent(r for sso in compacted for r in sso.ranges)
        to_sso = [r for r in merged if data.draw(st.booleans())]
        to_so = [r for r in merged if r not in to_sso]
        count = len(to_so) + (1 if to_sso else 0)
        first = self.run(self.m.prepare_object(count, TTL_MS)) if count else 0
        sso_id = first + len(to_so) if to_sso else -1
        self.attempt(
            self.m.commit_stream_set_object(
                node.node_id,
                self.epochs[node.node_id],
                sso_id,
                0,
                100,
                [CommitRange(r.stream_id, 0, r.start_offset, r.end_offset) for r in to_sso],
                [
                    CommitStreamObject(first + i, r.stream_id, r.start_offset, r.end_offset, 5)
                    for i, r in enumerate(to_so)
                ],
                [sso.object_id for sso in compacted],
            ),
            "compaction",
        )

    @precondition(lambda self: any(len(s.stream_objects) > 1 for s in self.image.streams.values()))
    @rule(data=st.data())
    def compact_stream_objects(self, data: st.DataObject) -> None:
        streams = [s for s in self.image.streams.values() if len(s.stream_objects) > 1]
        stream = data.draw(st.sampled_from(sorted(streams, key=_id)))
        sos = stream.stream_objects
        i = data.draw(st.integers(0, len(sos) - 2))
        j = i + 1
        while j < len(sos) and sos[j - 1].end_offset == sos[j].start_offset:
            j += 1
        run = sos[i:j]
        new = self.run(self.m.prepare_object(1, TTL_MS))
        epoch = data.draw(st.sampled_from([-1, stream.epoch]))
        self.attempt(
            self.m.commit_stream_object(
                new,
                stream.stream_id,
                epoch,
                run[0].start_offset,
                run[-1].end_offset,
                7,
                [so.object_id for so in run],
            )
        )

    @precondition(lambda self: any(s.ranges for s in self.image.streams.values()))
    @rule(data=st.data())
    def trim(self, data: st.DataObject) -> None:
        stream = data.draw(st.sampled_from(_opened_ever(self.image)))
        node = stream.ranges[-1].node_id
        new_start = data.draw(st.integers(stream.start_offset, stream.end_offset + 1))
        self.attempt(
            self.m.trim_stream(
                node, self.epochs.get(node, 0), stream.stream_id, stream.epoch, new_start
            )
        )

    @precondition(lambda self: self.epochs and self.image.streams)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        stream = data.draw(st.sampled_from(sorted(self.image.streams.values(), key=_id)))
        node = data.draw(st.sampled_from(sorted(self.epochs)))
        self.attempt(self.m.delete_stream(node, self.epochs[node], stream.stream_id, stream.epoch))

    @rule(ms=st.integers(0, 2 * TTL_MS))
    def expire_and_collect(self, ms: int) -> None:
        self.clock.now += ms
        self.run(self.m.expire_prepared())
        done = [o.object_id for o in self.m.objects_to_delete(self.clock.now)]
        self.run(self.m.mark_destroyed_done(done))

    @rule(key=st.sampled_from(["a", "b"]), value=st.binary(max_size=4) | st.none())
    def kv(self, key: str, value: bytes | None) -> None:
        if value is None:
            self.run(self.m.delete_kv(key))
        else:
            self.run(self.m.put_kv(key, value))
        assert self.m.get_kv(key) == value

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def store_equals_image(self) -> None:
        assert self.run(self.m._store.load()) == self.image

    @invariant()
    def streams_are_consistent(self) -> None:
        for s in self.image.streams.values():
            assert 0 <= s.start_offset <= s.end_offset
            if not s.ranges:
                assert (s.epoch, s.start_offset, s.end_offset) == (-1, 0, 0)
                continue
            assert s.ranges[0].start_offset == s.start_offset
            assert s.ranges[-1].end_offset == s.end_offset
            assert s.ranges[-1].epoch == s.epoch
            for a, b in itertools.pairwise(s.ranges):
                assert a.range_index < b.range_index
                assert a.end_offset == b.start_offset
            assert all(r.start_offset <= r.end_offset for r in s.ranges)
            previous_end = -1
            for so in s.stream_objects:
                assert previous_end <= so.start_offset < so.end_offset
                assert s.start_offset < so.end_offset <= s.end_offset
                obj = self.image.objects[so.object_id]
                assert (obj.state, obj.object_size) == (ObjectState.COMMITTED, so.object_size)
                previous_end = so.end_offset

    @invariant()
    def stream_set_objects_are_consistent(self) -> None:
        for node in self.image.nodes.values():
            for sso in node.stream_set_objects:
                assert sso.ranges
                assert self.image.objects[sso.object_id].state is ObjectState.COMMITTED
                for r in sso.ranges:
                    s = self.image.streams[r.stream_id]
                    assert r.start_offset < r.end_offset
                    assert s.start_offset < r.end_offset <= s.end_offset

    @invariant()
    def committed_objects_are_referenced_once(self) -> None:
        refs = [so.object_id for s in self.image.streams.values() for so in s.stream_objects]
        refs += [sso.object_id for n in self.image.nodes.values() for sso in n.stream_set_objects]
        committed = [
            o.object_id for o in self.image.objects.values() if o.state is ObjectState.COMMITTED
        ]
        assert sorted(refs) == sorted(committed)

    @invariant()
    def every_offset_is_found(self) -> None:
        for s in self.image.streams.values():
            if s.start_offset == s.end_offset:
                continue
            found = self.m.get_objects(s.stream_id, s.start_offset, -1, 10_000)
            assert found, s
            assert found[0].start_offset <= s.start_offset < found[0].end_offset
            for a, b in itertools.pairwise(found):
                assert a.end_offset == b.start_offset
            assert found[-1].end_offset == s.end_offset
            # the lookup index kept up by apply answers as one built afresh would
            fresh = MetadataImage(self.image.streams, self.image.nodes, self.image.objects)
            assert fresh.get_objects(s.stream_id, s.start_offset, -1, 10_000) == found

    @invariant()
    def counters_are_ahead(self) -> None:
        if self.image.objects:
            assert self.image.counters["object_id"] > max(self.image.objects)
        if self.image.streams:
            assert self.image.counters["stream_id"] > max(self.image.streams)


def _id(s: Any) -> int:
    return int(s.stream_id)


def _opened_ever(image: MetadataImage) -> list[Any]:
    return sorted((s for s in image.streams.values() if s.ranges), key=_id)


def _merge_adjacent(ranges: Any) -> list[StreamOffsetRange]:
    out: list[StreamOffsetRange] = []
    for r in sorted(ranges, key=lambda r: (r.stream_id, r.start_offset)):
        last = out[-1] if out else None
        if last and last.stream_id == r.stream_id and last.end_offset == r.start_offset:
            out[-1] = StreamOffsetRange(r.stream_id, last.start_offset, r.end_offset)
        else:
            out.append(r)
    return out


MetadataMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestMetadataInvariants = MetadataMachine.TestCase
