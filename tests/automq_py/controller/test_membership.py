"""The cluster's changes as pure functions: who may make them, what they record."""

from __future__ import annotations

import pytest

from automq_py.controller import membership
from automq_py.controller.cluster_records import (
    NO_LEADER,
    BrokerRegistration,
    ControllerRecord,
    TopicLeaders,
)
from automq_py.replica_manager import _complete_moves
from storage.metadata import control
from storage.metadata.image import MetadataImage
from storage.metadata.records import Record


def _apply(image: MetadataImage, records: list[Record]) -> MetadataImage:
    image.apply(records)
    return image


def _cluster(*nodes: int) -> MetadataImage:
    """Brokers registered at their first node epoch."""
    image = MetadataImage()
    for node in nodes:
        records, epoch = control.register_node(image, node)
        _apply(image, records)
        registration = BrokerRegistration(node, epoch, "127.0.0.1", 9000 + node)
        _apply(image, membership.register_broker(image, registration))
    return image


def test_registration_is_read_back() -> None:
    image = _cluster(0, 1)
    assert sorted(membership.brokers(image)) == [0, 1]
    assert membership.broker(image, 1) == BrokerRegistration(1, 1, "127.0.0.1", 9001)


def test_an_older_incarnation_cannot_register_again() -> None:
    image = _cluster(0)
    _apply(image, membership.register_broker(image, BrokerRegistration(0, 5, "h", 1)))
    with pytest.raises(membership.NotControllerError, match="older"):
        membership.register_broker(image, BrokerRegistration(0, 4, "h", 1))


def test_only_the_recorded_controller_changes_leaders() -> None:
    image = _cluster(0, 1)
    _apply(image, membership.set_new_topic_leaders("t", [0, 1]))
    me = ControllerRecord(0, 3)
    _apply(image, membership.claim_controller(image, me))
    _apply(image, membership.move_leaders(image, me, {"t": {0: 1}}))
    assert membership.topic_leaders(image, "t") == TopicLeaders((1, 1), (1, 0))
    # a newer lease holder took over: the former one is refused
    successor = ControllerRecord(1, 4)
    _apply(image, membership.claim_controller(image, successor))
    with pytest.raises(membership.NotControllerError, match="not the controller"):
        membership.move_leaders(image, me, {"t": {1: 0}})
    with pytest.raises(membership.NotControllerError, match="older"):
        membership.claim_controller(image, me)


def test_fencing_bumps_the_node_epoch_and_ignores_a_newer_incarnation() -> None:
    image = _cluster(0, 1)
    me = ControllerRecord(0, 1)
    _apply(image, membership.claim_controller(image, me))
    _apply(image, membership.fence_broker(image, me, 1, incarnation=1))
    fenced = membership.broker(image, 1)
    assert fenced is not None and fenced.fenced and not fenced.live
    assert image.nodes[1].epoch == 2  # its stream metadata commits are refused from now on
    assert membership.fence_broker(image, me, 1, incarnation=1) == []  # once
    # it restarted meanwhile (incarnation 3): a fence for the old one changes nothing
    _apply(image, control.register_node(image, 1)[0])
    _apply(image, membership.register_broker(image, BrokerRegistration(1, 3, "h", 1)))
    assert membership.fence_broker(image, me, 1, incarnation=1) == []
    assert membership.broker(image, 1).live  # type: ignore[union-attr]


def test_moves_name_live_brokers_only_and_bump_epochs() -> None:
    image = _cluster(0, 1, 2)
    _apply(image, membership.set_new_topic_leaders("t", [0, 1, 2]))
    _apply(image, membership.begin_shutdown(image, 2, incarnation=1))
    with pytest.raises(membership.UnknownBrokerError):
        membership.move_leaders(image, None, {"t": {0: 2}})
    _apply(image, membership.move_leaders(image, None, {"t": {2: 0, 1: NO_LEADER}}))
    assert membership.topic_leaders(image, "t") == TopicLeaders((0, NO_LEADER, 0), (0, 1, 1))
    assert membership.move_leaders(image, None, {"t": {0: 0}}) == []  # no change, no epoch


def test_partitions_added_and_topics_dropped() -> None:
    image = _cluster(0)
    _apply(image, membership.set_new_topic_leaders("t", [0]))
    _apply(image, membership.add_partition_leaders(image, "t", [0, 0]))
    assert membership.topic_leaders(image, "t") == TopicLeaders((0, 0, 0), (0, 0, 0))
    _apply(image, membership.drop_topic_leaders(image, "t"))
    assert membership.all_leaders(image) == {}
    assert membership.drop_topic_leaders(image, "t") == []


def test_a_reassignment_waits_for_its_leader_to_hand_the_partition_over() -> None:
    image = _cluster(0, 1, 2)
    _apply(image, membership.set_new_topic_leaders("t", [0, 1, 2]))
    with pytest.raises(membership.UnknownBrokerError):
        membership.request_moves(image, {"t": {0: 7}})
    _apply(image, membership.request_moves(image, {"t": {0: 1, 1: 1, 2: 0}}))
    leaders = membership.topic_leaders(image, "t")
    assert leaders is not None
    assert leaders.leaders == (0, 1, 2)  # nothing moved yet
    assert leaders.pending() == {0: 1, 2: 0}  # partition 1 is already led by 1
    # only the leader completes it, and only the reassignment asked for
    assert membership.complete_moves(image, 2, "t", {0: 1}) == []
    assert membership.complete_moves(image, 0, "t", {0: 2}) == []
    _apply(image, membership.complete_moves(image, 0, "t", {0: 1}))
    assert membership.topic_leaders(image, "t") == TopicLeaders((1, 1, 2), (1, 0, 0), (-1, -1, 0))
    # a failover elsewhere keeps it pending; cancelling it leaves the record as before any
    _apply(image, membership.move_leaders(image, None, {"t": {2: 1}}))
    assert membership.topic_leaders(image, "t").pending() == {2: 0}  # type: ignore[union-attr]
    _apply(image, membership.request_moves(image, {"t": {2: NO_LEADER}}))
    assert membership.topic_leaders(image, "t") == TopicLeaders((1, 1, 1), (1, 0, 1))
    assert TopicLeaders.decode(TopicLeaders((1,), (0,), (2,)).encode()).pending() == {0: 2}


def test_a_leader_hands_several_partitions_of_a_topic_over_in_one_record() -> None:
    """Every partition of the moves that still holds goes in the one record: those another
    broker leads, or whose reassignment changed, stay; one whose target left ends where it
    is."""
    image = _cluster(0, 1, 2)
    _apply(image, membership.set_new_topic_leaders("t", [0, 0, 0, 0, 2]))
    _apply(image, membership.request_moves(image, {"t": {0: 1, 1: 1, 2: 2, 3: 1, 4: 1}}))
    _apply(image, membership.begin_shutdown(image, 2, incarnation=1))
    records = membership.complete_moves(image, 0, "t", {0: 1, 1: 1, 2: 2, 3: 2, 4: 1})
    assert len(records) == 1
    _apply(image, records)
    # 0 and 1 moved; 2's target left; 3's reassignment is to 1, not 2; 4 is 2's to hand over
    assert membership.topic_leaders(image, "t") == TopicLeaders(
        (1, 1, 0, 0, 2), (1, 1, 0, 0, 0), (-1, -1, -1, 1, 1)
    )


def test_a_reassignment_to_a_broker_gone_meanwhile_ends_where_it_is() -> None:
    image = _cluster(0, 1)
    _apply(image, membership.set_new_topic_leaders("t", [0]))
    _apply(image, membership.request_moves(image, {"t": {0: 1}}))
    _apply(image, membership.begin_shutdown(image, 1, incarnation=1))
    _apply(image, membership.complete_moves(image, 0, "t", {0: 1}))
    assert membership.topic_leaders(image, "t") == TopicLeaders((0,), (0,))


def test_a_hand_over_moves_every_partition_asked_in_one_change() -> None:
    """The replica manager's change for a batch of hand-overs: every partition of a topic
    moves in it (each partition's own record, planned from one image, kept only the last
    one's move; the others waited for a change each)."""
    image = _cluster(0, 1, 2)
    _apply(image, membership.set_new_topic_leaders("t", [0, 0, 0]))
    _apply(image, membership.set_new_topic_leaders("u", [0, 0]))
    _apply(image, membership.request_moves(image, {"t": {0: 1, 1: 2, 2: 1}, "u": {0: 2, 1: 1}}))
    batch = {("t", 0): 1, ("t", 1): 2, ("t", 2): 1, ("u", 0): 2, ("u", 1): 1}
    records, _ = _complete_moves(0, batch, image)
    _apply(image, records)
    assert membership.topic_leaders(image, "t") == TopicLeaders((1, 2, 1), (1, 1, 1))
    assert membership.topic_leaders(image, "u") == TopicLeaders((2, 1), (1, 1))
