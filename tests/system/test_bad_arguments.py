"""Arguments the client cannot send (an integer past 64 bits, text with a lone
surrogate, a frame over the limit), given to the library or the CLI: a precise error at
the call, and the client goes on, across reconnects too.

Before, such a request failed to encode after it was kept among the requests sent again
after a reconnect: every reconnect failed on it from then on, and each later request
of that client timed out. A publish with such a header was accepted, then failed the
encoding of its whole frame: it and the publishes beside it timed out ("it was sent and
may still be stored", though nothing was sent). The CLI printed tracebacks."""

from __future__ import annotations

import pytest

from minou.errors import BadRequest, FrameTooLarge
from minou.limits import MAX_FRAME_SIZE

from .test_admin_cli import cli


def test_a_request_the_client_cannot_send_is_refused_at_once_and_the_client_goes_on(
        broker):
    c = broker.connect_sync("app", request_timeout=10, confirm_timeout=10)
    try:
        kv = c.kv("b")
        kv.put("k", 1)
        with pytest.raises(BadRequest, match="integers fit 64 bits"):
            kv.get("k", revision=10**23)
        with pytest.raises(BadRequest, match="integers fit 64 bits"):
            c.admin("kv.history", bucket="b", key="k", after=2**70)
        with pytest.raises(BadRequest, match="valid Unicode"):
            c.admin("kv.get", bucket="b", key="k\ud800")
        with pytest.raises(FrameTooLarge, match=f"over the {MAX_FRAME_SIZE} byte limit"):
            c.admin("kv.get", bucket="b", key="k" * (MAX_FRAME_SIZE + 1))
        with pytest.raises(BadRequest, match="lone surrogate"):
            c.send("a/v1/x", {"n": 1}, headers={"h": "\ud800"})
        with pytest.raises(BadRequest, match="lone surrogate"):
            c.send("a/v1/x", {"n": 1}, key="\udc80")
        assert c.send("a/v1/x", {"n": 2}).seq == 1  # nothing stuck ahead of it
        broker.kill()
        broker.start()  # the client reconnects: none of those is sent again
        assert kv.get("k").value == 1
        assert c.send("a/v1/x", {"n": 3}).seq == 2
        sub = c.consume("a/v1/x", group="g", prefetch=2)
        assert [sub.get(timeout=10).payload for _ in range(2)] == [{"n": 2}, {"n": 3}]
    finally:
        c.close()


@pytest.mark.parametrize(("args", "said"), [
    (["kv", "watch", "bad!", "--count", "1"], "refused: invalid bucket 'bad!'"),
    (["kv", "get", "b", "k", "--revision", str(10**23)], "Invalid value for '--revision'"),
    (["kv", "watch", "b", "--timeout", "nan"], "nan is not a finite number"),
    (["request", "a/v1/x", "1", "--timeout", "nan"], "nan is not a finite number"),
    (["consume", "a/v1/x", "--timeout", "inf"], "inf is not a finite number"),
])
def test_the_cli_names_a_bad_argument_without_a_traceback(broker, args, said):
    done = cli(broker, *args)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr[-1500:]
    assert said in done.stderr, done.stderr[-1500:]
