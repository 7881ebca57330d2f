"""A peer on the wrong port: its HTTP, read as a frame header, is named as HTTP."""

from __future__ import annotations

import pytest

from minou.errors import FrameTooLarge, ProtocolError
from minou.protocol.reader import FrameReader


@pytest.mark.parametrize("start", [b"HTTP/1.1 400 Bad Request\r\n", b"GET / HTTP/1.1\r\n",
                                   b"POST /v1/publish HTTP/1.1\r\n"])
def test_http_on_the_native_port_is_named_as_such(start):
    reader = FrameReader()
    reader.receive_data(start)
    with pytest.raises(ProtocolError, match="the peer speaks HTTP") as refused:
        reader.next_event()
    assert not isinstance(refused.value, FrameTooLarge)
    assert "ws://host:port/v1/ws" in str(refused.value)


def test_a_frame_too_large_that_is_not_http_says_its_size():
    reader = FrameReader()
    reader.receive_data(b"\x7f\xff\xff\xff\x01")
    with pytest.raises(FrameTooLarge, match="over the"):
        reader.next_event()
