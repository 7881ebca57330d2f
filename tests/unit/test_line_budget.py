"""oplog.LineBudget: the rate limit of the operator's log lines (security lines, a
federation pipe's refusals): so many lines a window, then one line counting the rest."""

from __future__ import annotations

from minou.server.oplog import LineBudget


def test_so_many_lines_a_window_then_one_counting_the_rest() -> None:
    said: list[tuple[int, float]] = []
    budget = LineBudget(3, 60.0, lambda n, seconds: said.append((n, seconds)))
    assert [budget.allow(100.0 + i) for i in range(5)] == [True, True, True, False, False]
    assert said == []  # counted, told when the window ends
    assert budget.allow(100.0 + 59.9) is False
    assert budget.allow(160.0) is True  # a new window: the count of the last one first
    assert said == [(3, 60.0)]
    assert [budget.allow(161.0) for _ in range(3)] == [True, True, False]
    assert budget.allow(300.0) is True and said == [(3, 60.0), (1, 140.0)]
    assert budget.allow(400.0) is True and len(said) == 2  # nothing held back: no line
