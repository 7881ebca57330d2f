"""How a stored revision is answered (server/kv.py ``entry_view``): JSON as its text,
never decoded; other bytes as base64, even bytes stored as JSON that are not."""

from __future__ import annotations

import base64

from minou.core.log import Msg
from minou.names import KV_DELETE, KV_OP
from minou.protocol.frames import JsonText
from minou.server.kv import entry_view

CH = "_kv/v1/config"


def test_json_is_answered_as_its_text_and_bytes_as_base64():
    put = entry_view(Msg(CH, 1, "a", b' {"a": [1, 2]}\n', key="k"))
    assert isinstance(put["value"], JsonText) and put["value_base64"] is None
    assert bytes(put["value"].text) == b'{"a": [1, 2]}'
    assert (put["key"], put["revision"], put["op"]) == ("k", 1, "put")
    raw = entry_view(Msg(CH, 2, "b", b"\x00\xff", True, key="k"))
    assert raw["value"] is None and raw["value_base64"] == "AP8="
    tomb = entry_view(Msg(CH, 3, "c", b"null", False, {KV_OP: KV_DELETE}, key="k"))
    assert (tomb["op"], tomb["value"], tomb["value_base64"]) == ("del", None, None)


def test_stored_bytes_that_are_not_one_json_value_are_never_spliced_into_an_answer():
    for data in (b'1, "op": "del"', b"[1,", b"\xff", b"[" * 100_000 + b"]" * 100_000):
        view = entry_view(Msg(CH, 4, "d", data, key="k"))
        assert view["value"] is None
        assert base64.b64decode(view["value_base64"]) == data
