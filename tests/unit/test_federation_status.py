"""A federation direction's status (no I/O): its rate and how long an error shows."""

from __future__ import annotations

from minou.server.federation import ERROR_KEPT_S, RATE_WINDOW_S, PipeStatus


def test_an_error_shows_until_the_direction_has_been_well_for_a_while() -> None:
    st = PipeStatus("eu-us", "push", ("orders/*",))
    st.state, st.last_error, st.last_error_at = "up", "us: connection refused", 1000.0
    st.healthy(1000.0 + ERROR_KEPT_S - 1)
    assert st.last_error == "us: connection refused"  # recent: still shown
    st.state = "retrying"
    st.healthy(1000.0 + ERROR_KEPT_S + 1)
    assert st.last_error  # not while it is down
    st.state = "up"
    st.healthy(1000.0 + ERROR_KEPT_S + 1)
    assert st.last_error == "" and st.last_error_at is None
    assert st.view()["last_error"] == ""


def test_the_rate_is_what_was_carried_over_the_last_window() -> None:
    st = PipeStatus("eu-us", "push", ("orders/*",))
    st.sample(0.0)
    st.forwarded = 500
    st.sample(5.0)
    assert st.rate == 100.0
    st.forwarded = 600
    st.sample(RATE_WINDOW_S + 10.0)  # the first sample left the window
    assert st.rate == (600 - 500) / (RATE_WINDOW_S + 5.0)


def test_backoff_doubles_while_tries_fail_and_starts_again_after_a_long_run() -> None:
    from minou.server.federation import BACKOFF_MAX_S, BACKOFF_MIN_S, BACKOFF_RESET_S, Backoff

    b = Backoff()
    waits = [b.failed(0.0) for _ in range(8)]
    assert waits[:3] == [BACKOFF_MIN_S, BACKOFF_MIN_S * 2, BACKOFF_MIN_S * 4]
    assert waits[-1] == BACKOFF_MAX_S and max(waits) == BACKOFF_MAX_S
    # Up a short while, then down again: still backing off.
    assert b.failed(BACKOFF_RESET_S - 1) == BACKOFF_MAX_S
    # Up long enough: the next cut is retried at once again, then doubles anew.
    assert b.failed(BACKOFF_RESET_S) == BACKOFF_MIN_S
    assert b.failed(0.0) == BACKOFF_MIN_S * 2
    b.ended()
    assert b.failed(0.0) == BACKOFF_MIN_S


def test_a_messages_path_is_every_broker_it_was_on_whatever_its_headers_say() -> None:
    from minou.server.federation import _path

    assert _path({}, "a") == ["a"]  # published here
    assert _path({"x-federated-from": "a"}, "b") == ["a", "b"]  # its first hop was a -> b
    assert _path({"x-federated-from": "a", "x-federated-path": '["a","b"]'}, "c") == \
        ["a", "b", "c"]
    assert _path({"x-federated-from": "a", "x-federated-path": '["a","b"]'}, "b") == \
        ["a", "b"]  # b's own last hop is not named twice
    # Made up, or from a client: it does not parse, or names others; the brokers it
    # really passes are added at each hop all the same.
    assert _path({"x-federated-from": "a", "x-federated-path": "{nope"}, "b") == ["a", "b"]
    assert _path({"x-federated-path": '[1, 2]'}, "b") == ["b"]
    assert _path({"x-federated-path": '["z"]'}, "b") == ["z", "b"]


def test_a_direction_carries_only_the_channels_its_patterns_match() -> None:
    from typing import Any, cast

    from minou.config import FederationLink
    from minou.server.federation import Pipe

    link = FederationLink("eu-us", "minou://127.0.0.1:1", pull=("prices/*", "fx/v1/usd"))
    pipe = Pipe(cast(Any, None), link, "pull", link.pull)
    offsets = {"prices/v1/tea": (1, 2), "fx/v1/usd": (1, 5), "fx/v1/eur": (1, 2),
               "_dead/prices/v1/tea": (1, 2), "billing/v1/a": (1, 2)}
    assert pipe._ours(offsets) == {"prices/v1/tea": (1, 2), "fx/v1/usd": (1, 5)}
    assert pipe.status.foreign_channels == 3
    assert pipe.status.last_error.startswith(
        "the remote named 3 channel(s) the patterns ['prices/*', 'fx/v1/usd'] do not match "
        "('_dead/prices/v1/tea', 'billing/v1/a', 'fx/v1/eur'): not carried")
    assert pipe._ours({"prices/v1/tea": (1, 2)}) == {"prices/v1/tea": (1, 2)}
    assert pipe.status.foreign_channels == 0
