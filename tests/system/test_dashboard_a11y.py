"""The dashboard audited as an accessibility reviewer would (issue 27): axe-core (WCAG
2.0/2.1 A and AA, and best practices) over every view and dialog, light and dark, at
desktop and phone width, on a broker with traffic, dead letters and a pending client.
Any violation fails the test, naming its rule and the elements it found."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import minou
from minou.errors import PendingApproval

from ..conftest import BrokerProcess, auth, wait_until
from .conftest import CHROMIUM
from .test_dashboard import admin_token, sign_in, start_dashboard_broker

AXE = Path(__file__).resolve().parents[1] / "vendor" / "axe" / "axe.min.js"
TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]
SIZES = {"desktop": {"width": 1440, "height": 900}, "phone": {"width": 390, "height": 844}}

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason="chromium is not installed (make test installs it)")


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker as an operator sees it: traffic, a dead letter, a pending client."""
    broker = start_dashboard_broker(tmp_path_factory.mktemp("a11y"))
    with minou.connect_sync(broker.url, **auth("app-a11y")) as c:
        c.send_many([("orders/v1/eu", {"total": i, "note": "x" * (i % 40)})
                     for i in range(30)])
        c.send("orders/v1/dead", {"total": 1})
        sub = c.consume("orders/v1/dead", group="a11y-workers")
        assert sub.get(timeout=5).nack()  # requeue_limit 0: a dead letter
        c.kv("config").put("feature.flag", {"on": True})
    with pytest.raises(PendingApproval):
        minou.connect_sync(broker.url, **auth("shop-a11y"), reconnect=False)
    yield broker
    broker.kill()


def _violations(page) -> list[str]:
    page.add_script_tag(path=str(AXE))
    result = page.evaluate(
        "async (tags) => (await axe.run(document, {runOnly: {type: 'tag', values: tags},"
        " resultTypes: ['violations']})).violations.map(v => [v.id, v.impact,"
        " v.nodes.slice(0, 5).map(n => n.target.join(' ') + ' :: ' +"
        " (n.failureSummary || '').split('\\n').slice(0, 2).join(' '))])", TAGS)
    return [f"{rule} ({impact}): " + " | ".join(nodes) for rule, impact, nodes in result]


VIEWS = {
    "overview": ("#/overview", "broker-id"),
    "queues": ("#/queues", "queue-filter"),
    "queue": ("#/queues/orders/v1", "diagnosis"),
    "dead-letters": ("#/queues/_dead/orders/v1", "queue-title"),
    "buckets": ("#/kv", None),
    "bucket": ("#/kv/config", None),
    "clients": ("#/clients", "schemas"),
    "cluster": ("#/cluster", None),
    "federation": ("#/federation", None),
}


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize("size", list(SIZES))
def test_no_axe_violation_on_any_view(browser, audited, theme, size) -> None:
    context = browser.new_context(viewport=SIZES[size], color_scheme=theme, bypass_csp=True)
    page = context.new_page()
    page.set_default_timeout(10_000)
    found: dict[str, list[str]] = {}
    try:
        page.goto(audited.http + "/")
        page.get_by_test_id("signin").wait_for()
        found["sign-in"] = _violations(page)
        sign_in(page, audited)
        for name, (route, ready) in VIEWS.items():
            page.goto(audited.http + "/" + route)
            if ready:
                page.get_by_test_id(ready).first.wait_for()
            page.wait_for_timeout(300)  # the first poll's data drawn
            found[name] = _violations(page)
        # A channel's message browser, a key's history
        page.goto(audited.http + "/#/queues/orders/v1")
        page.locator('[data-testid=channel][data-channel="eu"]').click()
        page.get_by_test_id("message-row").first.wait_for()
        found["message-browser"] = _violations(page)
        page.get_by_test_id("message-row").first.locator("summary").click()
        found["message-open"] = _violations(page)
        page.goto(audited.http + "/#/kv/config")
        page.locator('[data-testid=keys-table] tr[data-key="feature.flag"]') \
            .get_by_test_id("key-link").click()
        page.locator("[data-testid=history-table] tr[data-revision]").first.wait_for()
        found["key-history"] = _violations(page)
        # A dialog open over a page
        page.goto(audited.http + "/#/queues/orders/v1")
        page.get_by_test_id("diagnosis").wait_for()
        wait_until(lambda: page.get_by_test_id("dead-count").inner_text().strip()
                   not in ("", "0"), 10, what="the dead letter")
        page.get_by_test_id("dead-requeue").click()
        page.get_by_test_id("confirm-dialog").wait_for()
        found["confirm-dialog"] = _violations(page)
    finally:
        context.close()
    bad = {view: v for view, v in found.items() if v}
    assert not bad, "\n".join(f"{view}: {line}" for view, lines in bad.items()
                              for line in lines)


def _focused(page) -> dict:
    return page.evaluate("(() => { const e = document.activeElement;"
                         " return {tag: e.tagName, text: (e.innerText || '').trim(),"
                         " label: e.getAttribute('aria-label') || '',"
                         " testid: e.dataset.testid || ''}; })()")


def test_a_keyboard_walk_keeps_the_focus_on_the_content(browser, audited) -> None:
    """Sign in, skip to the content, open pages, confirm a dialog, approve a client,
    all with the keyboard: after each, the focus is on the new content's heading or a
    control, never the page's body; the toast never covers the focused control."""
    context = browser.new_context(viewport=SIZES["desktop"])
    page = context.new_page()
    page.set_default_timeout(10_000)
    try:
        with minou.connect_sync(audited.url, **auth("app-walk")) as c:
            c.send("orders/v1/walk", {"total": 2})
            sub = c.consume("orders/v1/walk", group="walkers")
            assert sub.get(timeout=5).nack()  # a dead letter to requeue
        with pytest.raises(PendingApproval):
            minou.connect_sync(audited.url, **auth("shop-walk"), reconnect=False)
        page.goto(audited.http + "/")
        page.get_by_test_id("token-input").wait_for()
        assert _focused(page)["testid"] == "token-input"
        page.keyboard.type(admin_token(audited))
        page.keyboard.press("Enter")
        page.get_by_test_id("broker-id").wait_for()
        assert _focused(page) | {"label": ""} == {"tag": "H1", "text": "Overview",
                                                   "label": "", "testid": ""}
        page.evaluate("document.activeElement.blur()")
        page.keyboard.press("Tab")  # the first stop: the skip link, visible
        assert _focused(page)["testid"] == "skip-link"
        assert page.get_by_test_id("skip-link").bounding_box()["y"] >= 0
        page.keyboard.press("Enter")
        assert _focused(page)["tag"] == "H1"
        page.get_by_test_id("nav-queues").focus()
        page.keyboard.press("Enter")
        page.get_by_test_id("queue-filter").wait_for()
        assert _focused(page)["text"] == "Queues"
        page.goto(audited.http + "/#/queues/orders/v1")
        wait_until(lambda: _focused(page)["text"] == "orders/v1", 10, what="the heading")
        requeue = page.get_by_test_id("dead-requeue")
        requeue.wait_for()  # visible: the view's first data is drawn
        wait_until(lambda: requeue.is_enabled(), 10, what="dead letters to requeue")
        requeue.focus()
        page.keyboard.press("Enter")
        page.get_by_test_id("confirm-dialog").wait_for()
        assert _focused(page)["testid"] == "confirm-no"  # the safe choice first
        page.keyboard.press("Tab")
        page.keyboard.press("Enter")
        page.get_by_test_id("toast").wait_for()
        wait_until(lambda: requeue.is_disabled(), 10, what="no dead letters left")
        wait_until(lambda: _focused(page)["tag"] != "BODY", 5, what="the focus kept")
        page.get_by_test_id("nav-clients").focus()
        page.keyboard.press("Enter")
        approve = page.locator('tr[data-client="shop-walk"]').get_by_test_id("approve")
        approve.wait_for()
        assert approve.get_attribute("aria-label") == "Approve client shop-walk"
        approve.focus()
        page.keyboard.press("Enter")
        page.get_by_test_id("toast").wait_for()
        wait_until(lambda: approve.count() == 0, 10, what="the client approved")
        wait_until(lambda: _focused(page)["tag"] != "BODY", 5, what="the focus kept")
        focused = page.evaluate("document.activeElement.getBoundingClientRect().toJSON()")
        shown = page.get_by_test_id("toast").bounding_box()
        assert not (shown["x"] < focused["right"] and focused["left"] < shown["x"] +
                    shown["width"] and shown["y"] < focused["bottom"] and
                    focused["top"] < shown["y"] + shown["height"]), (shown, focused)
    finally:
        context.close()


# The buttons of table rows that sit past their table's visible edge (or the window's)
OUT_OF_VIEW = """() => [...document.querySelectorAll('.table-wrap tbody button')].filter(b => {
    const r = b.getBoundingClientRect();
    const wrap = b.closest('.table-wrap').getBoundingClientRect();
    return r.right > Math.min(wrap.right, innerWidth) + 1; })
  .map(b => b.getAttribute('aria-label') || b.textContent)"""


def test_tables_fit_actions_in_view_on_a_desktop_and_names_on_a_phone(browser, audited):
    """At 1280 px every action of a table row (clients, a queue's groups, a bucket's
    keys) is visible without scrolling
    sideways; on a phone the wide tables keep their first (name) column in view, say
    they scroll (a focusable region with an edge shadow), and the stat tiles leave no
    empty gap at the end of a row."""
    for width, height in ((1280, 860), (390, 844)):
        context = browser.new_context(viewport={"width": width, "height": height})
        page = context.new_page()
        page.set_default_timeout(10_000)
        try:
            sign_in(page, audited)
            for route, ready in (("#/clients", "approve"), ("#/queues/orders/v1", "group-forget"),
                                 ("#/kv/config", "key-edit")):
                page.goto(audited.http + "/" + route)
                page.get_by_test_id(ready).first.wait_for()
                hidden = page.evaluate(OUT_OF_VIEW)
                assert width < 1280 or hidden == [], f"{width} px {route}: out of view: {hidden}"
            if width < 760:
                for route, table in (("#/clients", "clients-table"),
                                     ("#/queues", "queues-table")):
                    page.goto(audited.http + "/" + route)
                    page.get_by_test_id(table).locator("tbody tr").first.wait_for()
                    page.wait_for_timeout(200)
                    wrap = page.get_by_test_id(table).locator("xpath=..")
                    assert "scrolls" in (wrap.get_attribute("class") or "")
                    assert wrap.get_attribute("tabindex") == "0"
                    first = page.get_by_test_id(table).locator("tbody td").first
                    before = first.bounding_box()["x"]
                    wrap.evaluate("w => { w.scrollLeft = 400; }")
                    assert abs(first.bounding_box()["x"] - before) < 1, "the name scrolled away"
            page.goto(audited.http + "/#/overview")
            page.get_by_test_id("broker-id").wait_for()
            gap = page.evaluate("""() => {
                const s = document.querySelector('.stats'); const r = s.getBoundingClientRect();
                const tiles = [...s.children].map(t => t.getBoundingClientRect());
                const lastRowTop = Math.max(...tiles.map(t => t.top));
                const right = Math.max(...tiles.filter(t => t.top === lastRowTop)
                    .map(t => t.right));
                return r.right - right; }""")
            assert gap < 2, f"{width} px: {gap} px empty at the end of the tiles' last row"
        finally:
            context.close()
