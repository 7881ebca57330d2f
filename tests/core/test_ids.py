"""Message ids (``<16 hex digits: the channel's hash><seq in hex>``): every id a
publish answers names its channel and seq again (a receipt lookup needs no index); an
id new_id never makes names nothing; a hash two channels share names neither."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minou.core.broker import Broker
from minou.core.ids import MessageIds
from minou.core.log import ChannelLog
from minou.errors import ErrorCode, UnknownDelivery

from .helpers import Harness, send

_segment = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12)


@settings(derandomize=True, max_examples=25, deadline=None)
@given(ids=st.lists(_segment, min_size=1, max_size=5, unique=True),
       seq=st.integers(1, 2**60 - 1))  # 15 hex digits at most
def test_an_id_names_its_channel_and_seq_again(ids: list[str], seq: int) -> None:
    ids_ = MessageIds()
    logs = {f"orders/v1/{i}": ChannelLog(f"orders/v1/{i}") for i in ids}
    for log in logs.values():
        msg_id = ids_.new_id(log, seq)
        assert len(msg_id) == 16 + len(f"{seq:x}")
        assert ids_.find(msg_id, logs) == (log, seq)
    assert len({ids_.new_id(log, seq) for log in logs.values()}) == len(logs)


def test_channels_known_before_this_run_are_found_too() -> None:
    """After a restart no id of this run named the channel yet: find hashes them."""
    ids_ = MessageIds()
    log = ChannelLog("orders/v1/1")
    msg_id = MessageIds().new_id(ChannelLog("orders/v1/1"), 5)  # made by an earlier run
    assert ids_.find(msg_id, {log.name: log}) == (log, 5)
    later = ChannelLog("orders/v1/2")  # created after the first lookup: hashed as it is named
    assert ids_.find(ids_.new_id(later, 1), {log.name: log, later.name: later}) == (later, 1)


def test_the_ids_a_publish_answers_are_found_through_the_broker() -> None:
    h = Harness()
    outcomes = h.publish(send("orders/v1/a", 1), send("orders/v1/b", 2), send("orders/v1/a", 3))
    logs = h.broker.channels
    assert [h.broker.find_message(o.id) for o in outcomes] == [
        (logs["orders/v1/a"], 1), (logs["orders/v1/b"], 1), (logs["orders/v1/a"], 2)]


@pytest.mark.parametrize("bad", [
    "", "0" * 16, "0" * 16 + "0", "0" * 16 + "01", "G" + "0" * 15 + "1", "0" * 15 + "1",
    "0" * 16 + "1" * 16, "0" * 16 + "-1", "0" * 16 + "1 ", "0" * 16 + "A",
])
def test_a_malformed_id_names_nothing(bad: str) -> None:
    h = Harness()
    h.publish(send("orders/v1/a", 1))
    assert h.broker.find_message(bad) is None


def test_an_id_of_an_unknown_channel_names_nothing() -> None:
    other = MessageIds().new_id(ChannelLog("orders/v1/elsewhere"), 1)
    h = Harness()
    h.publish(send("orders/v1/a", 1))
    assert h.broker.find_message(other) is None


def test_an_id_whose_hash_two_channels_share_is_refused_naming_the_id() -> None:
    broker = Broker()
    h = Harness(broker=broker)
    (one,) = h.publish(send("orders/v1/1", 1))
    h.publish(send("orders/v1/2", 2))
    forged = broker.channels["orders/v1/2"]  # as if someone had found a collision
    forged.id_hash = broker.channels["orders/v1/1"].id_hash
    broker.state.ids.by_hash[forged.id_hash].append(forged.name)
    with pytest.raises(UnknownDelivery) as caught:
        broker.find_message(one.id)
    assert (caught.value.code, caught.value.detail) == (ErrorCode.UNKNOWN_DELIVERY,
                                                       {"id": one.id})


def test_naming_many_messages_of_a_channel_indexes_its_name_once() -> None:
    """The hash index grows with channels, not with messages (it lives as long as the
    broker)."""
    ids_ = MessageIds()
    log = ChannelLog("orders/v1/1")
    for seq in range(1, 50):
        ids_.new_id(log, seq)
    assert sum(len(names) for names in ids_.by_hash.values()) == 1
