"""The README example, end to end against a real broker process."""

from __future__ import annotations


def test_send_consume_ack_round_trip(broker):
    with broker.connect_sync() as client:
        receipt = client.send("orders/v1/42", {"total": 12.5})
        assert receipt.seq == 1 and receipt.channel == "orders/v1/42"
        sub = client.consume("orders/v1/*", group="billing")
        msg = sub.get(timeout=5)
        assert (msg.channel, msg.seq, msg.payload, msg.attempts) == (
            "orders/v1/42", 1, {"total": 12.5}, 1)
        assert msg.ack() is True
    assert broker.stop() == 0
