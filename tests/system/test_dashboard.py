"""The dashboard in a real browser: Playwright driving Debian's headless Chromium against a
real broker. ``MINOU_SCREENSHOTS=1`` also writes the screenshots in docs/screenshots/."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import minou
from minou.auth import keys as keyfiles
from minou.auth.tokens import make_token
from minou.errors import PendingApproval

from ..conftest import BrokerProcess, auth, wait_until
from ..redis_server import REDIS_SERVER, RedisServer, free_port
from .conftest import CHROMIUM
from .test_admin_paging import client_ids, stage_clients
from .test_federation import link, start

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
CONFIG = """
[[rules]]
client = "app-*"
read = ["*"]
write = ["*"]

[[rules]]
client = "shop-*"
read = ["orders/*"]
write = ["orders/*"]
accept = false

[channels."orders/v1"]
requeue_limit = 0

[channels."orders/v1".schema]
type = "object"
required = ["total"]

[channels."orders/v2".schema]
type = "object"
required = ["total", "currency"]

[kv."config"]
history = 5
"""

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason="chromium is not installed (make test installs it)")


def start_dashboard_broker(base: Path) -> BrokerProcess:
    """A broker with CONFIG's rules, schemas and bucket (authenticated mode)."""
    cfg = base / "dash.toml"
    cfg.write_text(CONFIG)
    return BrokerProcess(base / "data", config=cfg).start()


@pytest.fixture(scope="module")
def dash_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = start_dashboard_broker(tmp_path_factory.mktemp("dash"))
    yield broker
    broker.kill()


def admin_token(broker: BrokerProcess, broker_id: str = "minou") -> str:
    key = keyfiles.load_private(broker.admin_key)
    return make_token("admin", key, broker_id, ttl=600)


@pytest.fixture
def page(browser, dash_broker):
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    pg = context.new_page()
    pg.set_default_timeout(10_000)
    yield pg
    context.close()


def sign_in(page, broker: BrokerProcess, token: str | None = None) -> None:
    page.goto(broker.http + "/")
    page.get_by_test_id("token-input").fill(token or admin_token(broker))
    page.get_by_test_id("signin-button").click()
    page.get_by_test_id("broker-id").wait_for()
    # The page is drawn before its first poll answers: wait for the data.
    wait_until(lambda: page.get_by_test_id("broker-id").inner_text().strip() not in ("", "—"),
               10, what="the overview's first data")


def shot(page, name: str) -> None:
    if os.environ.get("MINOU_SCREENSHOTS"):
        SHOTS.mkdir(parents=True, exist_ok=True)
        # A viewport as tall as the page (not full_page): the sticky sidebar then
        # reaches the bottom, as it does on screen.
        size = page.viewport_size
        height = page.evaluate("document.documentElement.scrollHeight")
        page.set_viewport_size({"width": size["width"], "height": height})
        page.screenshot(path=str(SHOTS / f"{name}.png"))
        page.set_viewport_size(size)


def test_refused_without_a_token(page, dash_broker):
    page.goto(dash_broker.http + "/")
    page.get_by_test_id("signin").wait_for()
    assert page.get_by_test_id("broker-id").count() == 0
    page.get_by_test_id("token-input").fill("not-a-token")
    page.get_by_test_id("signin-button").click()
    error = page.get_by_test_id("signin-error")
    error.wait_for()
    assert "token" in error.inner_text().lower()
    # The data behind the page needs a token too.
    assert httpx.get(dash_broker.http + "/v1/queues").status_code == 401
    assert httpx.get(dash_broker.http + "/metrics").status_code == 401
    headers = httpx.get(dash_broker.http + "/").headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"


def test_a_non_admin_cannot_sign_in(page, dash_broker):
    with minou.connect_sync(dash_broker.url, **auth("app-viewer")):
        pass
    key = keyfiles.load_private(Path(auth("app-viewer")["key"]))
    page.goto(dash_broker.http + "/")
    page.get_by_test_id("token-input").fill(make_token("app-viewer", key, "minou"))
    page.get_by_test_id("signin-button").click()
    page.get_by_test_id("signin-error").wait_for()
    assert "admin" in page.get_by_test_id("signin-error").inner_text()


def test_overview_and_a_queue_appearing_with_a_moving_rate_chart(page, dash_broker):
    sign_in(page, dash_broker)
    assert page.get_by_test_id("broker-id").inner_text().strip() == "minou"
    assert "sqlite" in page.get_by_test_id("storage").inner_text().lower()
    chart = page.get_by_test_id("rates-chart")
    chart.wait_for()
    with minou.connect_sync(dash_broker.url, **auth("app-publisher")) as c:
        start = int(chart.get_attribute("data-points") or 0)
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:  # publish for a few polls: the chart moves
            c.send_many([("orders/v1/42", {"total": i}) for i in range(50)])
            time.sleep(0.25)
        wait_until(lambda: int(chart.get_attribute("data-points") or 0) >= start + 2, 10,
                   what="the rate chart to gain points")
        total = int(page.get_by_test_id("total-published").inner_text().replace(",", ""))
        assert total >= 50
        shot(page, "overview")
        page.get_by_test_id("nav-queues").click()
        row = page.locator('tr[data-queue="orders/v1"]')
        row.wait_for()
        page.get_by_test_id("queue-filter").fill("nothing-like-this")
        wait_until(lambda: page.locator('tr[data-queue="orders/v1"]').count() == 0, 5,
                   what="the filter to hide the queue")
        page.get_by_test_id("queue-filter").fill("orders")
        row.wait_for()
        shot(page, "queues")


def test_browse_a_message_and_requeue_a_dead_letter(page, dash_broker):
    with minou.connect_sync(dash_broker.url, **auth("app-worker")) as c:
        c.send("orders/v1/7", {"total": 7, "note": "browse me"})
        sub = c.consume("orders/v1/7", group="dash-workers")
        msg = sub.get(timeout=5)
        assert msg.nack()  # requeue_limit = 0: dead-lettered at once
        sign_in(page, dash_broker)
        page.goto(dash_broker.http + "/#/queues/orders/v1")
        wait_until(lambda: page.get_by_test_id("queue-title").inner_text().strip() ==
                   "orders/v1", 10, what="the queue page")
        page.get_by_test_id("diagnosis").wait_for()
        wait_until(lambda: page.get_by_test_id("dead-count").inner_text().strip() not in
                   ("", "0"), 10, what="the dead letter to show")
        page.get_by_test_id("dead-requeue").click()
        page.get_by_test_id("confirm-dialog").wait_for()
        page.get_by_test_id("confirm-yes").click()
        page.get_by_test_id("toast").wait_for()
        assert "requeued" in page.get_by_test_id("toast").inner_text().lower()
        wait_until(lambda: page.get_by_test_id("dead-count").inner_text().strip() == "0", 10,
                   what="the dead letters to be gone")
        back = sub.get(timeout=5)
        assert back.payload == {"total": 7, "note": "browse me"}
        # The message browser shows it, pretty-printed.
        page.goto(dash_broker.http + "/#/queues/orders/v1")
        page.locator('[data-testid=channel][data-channel="7"]').click()
        row = page.get_by_test_id("message-row").last
        row.wait_for()
        # One line each, the payload's first bytes in it; opened in place
        assert '"note":"browse me"' in row.locator("[data-field=preview]").inner_text()
        assert row.get_by_test_id("message-payload").is_hidden()
        row.locator("summary").click()
        payloads = page.get_by_test_id("message-payload").all_inner_texts()
        assert any('"note": "browse me"' in p for p in payloads), payloads
        shot(page, "queue")
        assert back.ack()


def test_approve_a_pending_client(page, dash_broker):
    with pytest.raises(PendingApproval):
        minou.connect_sync(dash_broker.url, **auth("shop-1"), reconnect=False)
    sign_in(page, dash_broker)
    page.get_by_test_id("nav-clients").click()
    row = page.locator('tr[data-client="shop-1"]')
    row.wait_for()
    assert row.get_by_test_id("client-status").inner_text().strip() == "pending"
    page.get_by_test_id("schemas").wait_for()
    assert "BREAKING" in page.get_by_test_id("schemas").inner_text()
    shot(page, "clients")
    row.get_by_test_id("approve").click()
    wait_until(lambda: row.get_by_test_id("client-status").inner_text().strip() == "active",
               10, what="the client to be approved")
    with minou.connect_sync(dash_broker.url, **auth("shop-1"), reconnect=False) as c:
        assert c.send("orders/v1/1", {"total": 1}).seq >= 1


def test_dark_theme_and_a_phone_sized_screen(browser, dash_broker):
    context = browser.new_context(viewport={"width": 390, "height": 844},
                                  color_scheme="dark")
    page = context.new_page()
    page.set_default_timeout(10_000)
    try:
        sign_in(page, dash_broker)
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        r, g, b = (int(x) for x in background.strip("rgba()").split(",")[:3])
        assert r + g + b < 200, background  # dark
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 400, "the page overflows a phone screen"
        shot(page, "overview-phone-dark")
        page.get_by_test_id("theme-toggle").click()
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        r, g, b = (int(x) for x in background.strip("rgba()").split(",")[:3])
        assert r + g + b > 500, background  # light after the toggle
    finally:
        context.close()


def test_charts_start_with_the_brokers_last_minutes(browser, dash_broker):
    """A fresh page's charts are not empty: they start from the rates the broker kept
    (one sample a second), before the page's own polls could draw anything."""
    with minou.connect_sync(dash_broker.url, **auth("app-history")) as c:
        sub = c.consume("audit/v1/*", group="history")
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:  # a few of the broker's one-second samples
            c.send_many([("audit/v1/1", {"n": i}) for i in range(20)])
            for _ in range(20):
                sub.get(timeout=5).ack()
        admin = {"Authorization": f"Bearer {admin_token(dash_broker)}"}
        kept = httpx.get(dash_broker.http + "/v1/rates/history", params={"queue": "audit/v1"},
                         headers=admin).json()
        assert len(kept["t"]) >= 3 and max(r or 0 for r in kept["published"]) > 0, kept
        assert max(r or 0 for r in kept["acked"]) > 0, kept
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(10_000)
    try:
        sign_in(page, dash_broker)  # returns once the overview's first poll is drawn
        assert int(page.get_by_test_id("rates-chart").get_attribute("data-points")) >= 3
        page.goto(dash_broker.http + "/#/queues/audit/v1")
        wait_until(lambda: page.get_by_test_id("q-depth").inner_text().strip() not in
                   ("", "—"), 10, what="the queue page's first data")
        assert int(page.get_by_test_id("queue-chart").get_attribute("data-points")) >= 3
    finally:
        context.close()


def _hue(css_color: str) -> float:
    r, g, b = (int(css_color.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4))
    hi, lo = max(r, g, b), min(r, g, b)
    if hi == lo:
        return 0.0
    if hi == r:
        h = (g - b) / (hi - lo) % 6
    elif hi == g:
        h = (b - r) / (hi - lo) + 2
    else:
        h = (r - g) / (hi - lo) + 4
    return h * 60


def test_the_three_rate_lines_differ_in_colour_and_dash_in_both_themes(page, dash_broker):
    sign_in(page, dash_broker)
    for theme in ("light", "dark"):
        page.evaluate(f"document.documentElement.dataset.theme = '{theme}'")
        colours = page.evaluate("""['--chart-publish', '--chart-deliver', '--chart-ack'].map(
            (v) => getComputedStyle(document.documentElement).getPropertyValue(v).trim())""")
        hues = [_hue(c) for c in colours]
        gaps = [min(abs(a - b), 360 - abs(a - b)) for i, a in enumerate(hues)
                for b in hues[i + 1:]]
        assert min(gaps) >= 60, (theme, colours, hues)  # not three blues
    swatches = page.get_by_test_id("rates-chart").locator("xpath=ancestor::section[1]")
    dashes = swatches.locator("svg.sw").evaluate_all("(els) => els.map((e) => e.dataset.dash)")
    assert len(dashes) == 3 and len(set(dashes)) == 3, dashes


def test_queue_page_names_waiting_and_in_flight_apart(page, dash_broker):
    with minou.connect_sync(dash_broker.url, **auth("app-terms")) as c:
        c.send_many([("audit/v2/1", {"n": 1}), ("audit/v2/1", {"n": 2})])
        held = c.consume("audit/v2/1", group="terms").get(timeout=5)  # in flight
        sign_in(page, dash_broker)
        page.goto(dash_broker.http + "/#/queues/audit/v2")
        wait_until(lambda: page.get_by_test_id("q-in-flight").inner_text().strip() == "1",
                   10, what="the in-flight count")
        assert page.get_by_test_id("q-waiting").inner_text().strip() == "1"
        assert page.get_by_test_id("q-oldest-waiting").inner_text().startswith("oldest ")
        assert page.get_by_test_id("q-oldest-in-flight").inner_text().startswith("oldest ")
        assert page.get_by_text("Unsettled", exact=True).count() == 0
        assert held.ack()


def _pixel_rgb(browser, png: bytes, x: int, y: int) -> tuple[int, int, int]:
    """A pixel of a PNG, decoded by the browser itself (no imaging library needed)."""
    import base64

    page = browser.new_page()
    try:
        return tuple(page.evaluate("""async ([src, x, y]) => {
            const img = new Image();
            img.src = src;
            await img.decode();
            const canvas = document.createElement('canvas');
            canvas.width = img.width;
            canvas.height = img.height;
            const ctx = canvas.getContext('2d');
            ctx.drawImage(img, 0, 0);
            return Array.from(ctx.getImageData(x, y, 1, 1).data.slice(0, 3));
        }""", ["data:image/png;base64," + base64.b64encode(png).decode(), x, y]))
    finally:
        page.close()


def test_the_sidebar_reaches_the_bottom_of_a_long_page(browser, page, dash_broker):
    with minou.connect_sync(dash_broker.url, **auth("app-long")) as c:
        c.send_many([(f"audit/v3/{i}", {"n": i}) for i in range(150)])
    sign_in(page, dash_broker)
    page.set_viewport_size({"width": 1280, "height": 600})
    page.goto(dash_broker.http + "/#/queues/audit/v3")
    page.get_by_test_id("message-row").first.wait_for()
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height > 2 * 600, height  # a long page
    page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
    # In view at the bottom: the whole screen's height, from its top.
    box = page.evaluate("(({top, height}) => ({top, height}))(document.querySelector("
                        "'.sidebar').getBoundingClientRect())")
    assert abs(box["top"]) < 1 and abs(box["height"] - 600) < 1, box
    # And its column all the way down the page, even where 100vh is one screen (a
    # full-page capture): the sidebar's colour at the top and at the bottom.
    surface = page.evaluate("getComputedStyle(document.querySelector('.sidebar'))"
                            ".backgroundColor")
    want = tuple(int(v) for v in surface.strip("rgba()").split(",")[:3])
    png = page.screenshot(full_page=True)
    x = 226  # inside the column, right of every nav item and label
    for y in (5, height // 2, height - 5):
        assert _pixel_rgb(browser, png, x, y) == want, (y, surface)


def test_development_mode_has_no_sign_out(browser, tmp_path):
    broker = BrokerProcess(tmp_path / "dev", extra=["--dev"], open_rules=False).start()
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(10_000)
    try:
        page.goto(broker.http + "/")
        page.get_by_test_id("dev-badge").wait_for()
        assert not page.get_by_test_id("signout").is_visible()  # nobody to sign out
        assert page.locator("#identity").inner_text() == "development mode: no sign-in"
        assert page.get_by_test_id("signin").is_hidden()
    finally:
        context.close()
        broker.kill()


def test_a_pending_admin_promotion_is_shown_and_approved(browser, tmp_path):
    """An id listed in auth.admins after it registered as a non-admin shows as waiting;
    "Approve as admin" (behind a confirmation) makes its key an admin's."""
    cfg = tmp_path / "promo.toml"
    rules = '[[rules]]\nclient = "ops-*"\nread = ["*"]\nwrite = ["*"]\n'
    cfg.write_text(rules)
    broker = BrokerProcess(tmp_path / "promo", config=cfg, open_rules=False).start()
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(10_000)
    try:
        with minou.connect_sync(broker.url, **auth("ops-1"), reconnect=False) as c:
            assert c.admin("whoami")["admin"] is False
        cfg.write_text('[auth]\nadmins = ["admin", "ops-1"]\n\n' + rules)
        with minou.connect_sync(broker.url, **broker.admin_auth(reconnect=False)) as a:
            a.admin("reload")
        sign_in(page, broker)
        page.get_by_test_id("nav-clients").click()
        row = page.locator('tr[data-client="ops-1"]')
        row.get_by_test_id("admin-pending").wait_for()
        row.get_by_test_id("approve-admin").click()
        page.get_by_test_id("confirm-yes").click()
        wait_until(lambda: row.get_by_test_id("admin-pending").count() == 0, 10,
                   what="the promotion to show")
        with minou.connect_sync(broker.url, **auth("ops-1"), reconnect=False) as c:
            assert c.admin("whoami")["admin"] is True
    finally:
        context.close()
        broker.kill()


def test_the_cluster_page_of_a_broker_alone_on_sqlite(page, dash_broker):
    sign_in(page, dash_broker)
    page.get_by_test_id("nav-cluster").click()
    single = page.get_by_test_id("cluster-single")
    single.wait_for()
    assert "run several brokers on one Redis to get a cluster" in single.inner_text()
    assert page.get_by_test_id("nav-cluster").get_attribute("aria-current") == "page"
    assert page.title() == "Cluster · minou"
    rows = page.locator("[data-testid=brokers-table] tr[data-broker]")
    wait_until(lambda: rows.count() == 1, 10, what="the one broker")
    assert rows.get_attribute("data-role") == "primary"
    assert rows.get_by_test_id("broker-role").inner_text().strip() == "primary"
    assert rows.get_by_test_id("this-broker").is_visible()
    assert dash_broker.url in rows.inner_text()
    # Nothing of a cluster to show: no queue epochs, no takeovers, no lease counters.
    for testid in ("cluster-queues-table", "cluster-events-table", "this-broker-counters"):
        assert page.get_by_test_id(testid).is_hidden(), testid


def _serving(b: BrokerProcess) -> bool:
    try:
        return httpx.get(b.http + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.timeout(180)
@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
def test_the_cluster_page_of_two_brokers_on_one_redis(browser, broker_factory, tmp_path):
    """A primary and a standby on a real redis-server: the page shows both with their
    roles, the queue with its epoch and the events; after a clean stop of the primary,
    the standby's page shows that it took over (epoch 2)."""
    redis = RedisServer(tmp_path / "redis").start()
    cfg = tmp_path / "cluster.toml"
    cfg.write_text("[storage]\nowner_lease = 3\n")
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(10_000)
    try:
        primary = broker_factory.make(config=cfg, storage=redis.url).start()
        with primary.connect_sync("app-cluster") as c:
            c.send("orders/v1/1", {"total": 1})
        standby = broker_factory.make(config=cfg, storage=redis.url)
        standby.port, standby.http_port = free_port(), free_port()
        standby.start(ready="standby:")
        token = admin_token(primary)
        sign_in(page, primary, token)
        page.get_by_test_id("nav-cluster").click()
        brokers = page.locator("[data-testid=brokers-table] tr[data-broker]")
        wait_until(lambda: brokers.count() == 2, 10, what="both brokers")
        me = page.locator("[data-testid=brokers-table] tr[data-self]")
        assert me.get_attribute("data-role") == "primary"
        assert me.get_by_test_id("broker-role").inner_text().strip() == "primary"
        assert me.get_by_test_id("this-broker").is_visible()
        assert primary.url in me.inner_text()
        first_id = me.get_attribute("data-broker")
        other = page.locator('[data-testid=brokers-table] tr[data-role="standby"]')
        assert other.get_by_test_id("broker-role").inner_text().strip() == "standby"
        assert standby.url in other.inner_text()
        assert other.get_by_test_id("this-broker").count() == 0
        assert re.fullmatch(r"\d+ \(\d+ in all\)",
                            other.get_by_test_id("broker-relaying").inner_text().strip())
        assert me.get_by_test_id("broker-relaying").inner_text().strip() == "—"
        queue = page.locator('[data-testid=cluster-queues-table] tr[data-queue="orders/v1"]')
        queue.wait_for()
        assert queue.get_attribute("data-epoch") == "1"
        assert first_id in queue.inner_text()
        page.locator('[data-testid=cluster-events-table] tr[data-event="became primary"]'
                     ).wait_for()
        assert page.get_by_test_id("cluster-single").is_hidden()
        assert page.get_by_test_id("cluster-primary").inner_text().strip() == first_id
        wait_until(lambda: int(page.get_by_test_id("lease-renewals").inner_text()
                               .replace(",", "")) > 0, 10, what="a lease renewal")
        assert page.get_by_test_id("fenced-writes").inner_text().strip() == "0"
        shot(page, "cluster")

        # A clean stop gives the lease back and wakes the standby: it takes over.
        assert primary.stop() == 0
        wait_until(lambda: _serving(standby), 15, what="the standby to take over")
        sign_in(page, standby, token)
        page.goto(standby.http + "/#/cluster")
        took = page.locator('[data-testid=cluster-events-table] '
                            'tr[data-event="took over (handed over)"]')
        took.wait_for()
        assert first_id in took.inner_text()  # from the old primary
        assert page.locator('[data-testid=cluster-events-table] '
                            'tr[data-event="gave the lease back (clean stop)"]').count() == 1
        queue.wait_for()
        wait_until(lambda: queue.get_attribute("data-epoch") == "2", 10, what="epoch 2")
        me = page.locator("[data-testid=brokers-table] tr[data-self]")
        assert me.get_attribute("data-role") == "primary"
        assert me.get_attribute("data-broker") != first_id
        # A hand-over is no failure: the takeovers counter (and metric) counts failures.
        assert page.get_by_test_id("takeovers").inner_text().strip() == "0"
    finally:
        context.close()
        redis.stop()


def _kv_row(page, key: str):
    return page.locator(f'[data-testid=keys-table] tr[data-key="{key}"]')


def _bucket_page(page, broker: BrokerProcess, bucket: str) -> None:
    page.goto(f"{broker.http}/#/kv/{bucket}")
    wait_until(lambda: page.get_by_test_id("bucket-title").inner_text().strip() == bucket, 10,
               what="the bucket page")


def test_the_buckets_page_and_a_buckets_keys_values_and_history(page, dash_broker):
    with minou.connect_sync(dash_broker.url, **dash_broker.admin_auth()) as c:
        kv = c.kv("config")
        kv.put("limit", 10)
        kv.put("limit", 12)
        kv.put("feature/dark", {"on": True, "since": "2025"})
        kv.put("mode", "a")
        kv.delete("mode")
        kv.put("mode", "b")
        kv.put("gone", "bye")
        kv.delete("gone")
        limit = kv.get("limit")
        sign_in(page, dash_broker)
        page.get_by_test_id("nav-kv").click()
        row = page.locator('[data-testid=buckets-table] tr[data-bucket="config"]')
        row.wait_for()
        assert page.get_by_test_id("nav-kv").get_attribute("aria-current") == "page"
        cells = [t.strip() for t in row.locator("td").all_inner_texts()]
        assert cells[0] == "config" and cells[1] == "3", cells  # gone is not counted
        assert cells[3] == "5" and cells[4] == "none", cells  # history, ttl
        row.get_by_test_id("bucket-link").click()
        wait_until(lambda: page.get_by_test_id("bucket-title").inner_text().strip() == "config",
                   10, what="the bucket page")
        assert page.url.endswith("#/kv/config")
        rows = page.locator("[data-testid=keys-table] tr[data-key]")
        wait_until(lambda: rows.count() == 3, 10, what="the keys")
        assert [r.get_attribute("data-key") for r in rows.all()] == [
            "feature/dark", "limit", "mode"]
        options = page.get_by_test_id("bucket-options")
        assert options.locator("dd[data-option=history]").inner_text() == "5 revisions per key"
        wait_until(lambda: _kv_row(page, "limit").get_by_test_id("key-value").inner_text()
                   == "12", 10, what="the value of limit")
        assert _kv_row(page, "limit").get_attribute("data-revision") == str(limit.revision)
        assert _kv_row(page, "feature/dark").get_by_test_id("key-value").inner_text() == \
            '{"on":true,"since":"2025"}'
        assert _kv_row(page, "mode").get_by_test_id("key-value").inner_text() == '"b"'
        shot(page, "bucket")

        # A key's history, newest first, the delete marked.
        _kv_row(page, "mode").get_by_test_id("key-link").click()
        history = page.locator("[data-testid=history-table] tr[data-revision]")
        wait_until(lambda: history.count() == 3, 10, what="the history of mode")
        assert [r.get_attribute("data-op") for r in history.all()] == ["put", "del", "put"]
        assert [r.get_by_test_id("history-op").inner_text() for r in history.all()] == [
            "put", "deleted", "put"]
        assert history.nth(0).get_by_test_id("history-value").inner_text() == '"b"'
        assert history.nth(2).get_by_test_id("history-value").inner_text() == '"a"'
        assert _kv_row(page, "mode").get_by_test_id("key-link").get_attribute(
            "aria-pressed") == "true"
        # A write shows without a reload: the row's value and the history.
        kv.put("mode", {"c": 3})
        wait_until(lambda: history.count() == 4, 10, what="the new revision in the history")
        wait_until(lambda: _kv_row(page, "mode").get_by_test_id("key-value").inner_text()
                   == '{"c":3}', 10, what="the new value of mode")
        # The prefix filter asks the broker for the keys starting with it.
        page.get_by_test_id("key-filter").fill("feature/")
        wait_until(lambda: rows.count() == 1, 10, what="the prefix filter")
        assert rows.get_attribute("data-key") == "feature/dark"
        kv.put("feature/beta", False)
        wait_until(lambda: rows.count() == 2, 10, what="a new key under the prefix")
        assert _kv_row(page, "feature/beta").get_by_test_id("key-value").inner_text() == "false"


def test_a_bucket_shows_its_first_1000_keys_and_says_there_are_more(page, dash_broker):
    with minou.connect_sync(dash_broker.url, **dash_broker.admin_auth()) as c:
        c.send_many([{"channel": "_kv/v1/big", "payload": i, "key": f"k{i:04d}"}
                     for i in range(1005)])
    sign_in(page, dash_broker)
    _bucket_page(page, dash_broker, "big")
    rows = page.locator("[data-testid=keys-table] tr[data-key]")
    wait_until(lambda: rows.count() == 1000, 15, what="the first 1000 keys")
    more = page.get_by_test_id("keys-more")
    assert more.is_visible() and "first 1,000 keys of 1,005" in more.inner_text()
    assert rows.nth(999).get_attribute("data-key") == "k0999"
    wait_until(lambda: rows.nth(999).get_by_test_id("key-value").inner_text() == "999", 10,
               what="the values of the keys shown")
    # Polls go on, but read no value again while the bucket's revision stays put.
    paths: list[str] = []
    page.on("request", lambda r: paths.append(r.url.split("/", 3)[3]))
    page.wait_for_timeout(4500)  # (events reach Python while Playwright waits)
    assert sum(p.startswith("v1/kv/big?") for p in paths) >= 2, paths
    assert [p for p in paths if p.startswith(("v1/kv-watch/", "v1/kv/big/"))] == [], paths
    page.get_by_test_id("key-filter").fill("k100")
    wait_until(lambda: rows.count() == 5, 10, what="the keys starting with k100")
    assert more.is_hidden()
    assert _kv_row(page, "k1004").get_by_test_id("key-value").inner_text() == "1004"


def test_edit_a_value_with_its_revision_and_refuse_a_concurrent_change(page, dash_broker):
    writes = []
    page.on("request", lambda r: writes.append(r) if r.method in ("PUT", "DELETE") else None)
    with minou.connect_sync(dash_broker.url, **dash_broker.admin_auth()) as c:
        kv = c.kv("limits")
        first = kv.put("retries", 3)
        sign_in(page, dash_broker)
        _bucket_page(page, dash_broker, "limits")
        row = _kv_row(page, "retries")
        wait_until(lambda: row.get_attribute("data-revision") == str(first), 10,
                   what="the key's revision")
        row.get_by_test_id("key-edit").click()
        editor = page.get_by_test_id("value-input")
        assert editor.input_value() == "3"
        save = page.get_by_test_id("value-save")
        error = page.get_by_test_id("editor-error")

        # Invalid JSON: a precise message, and nothing is sent.
        editor.fill('{"max": nope}')
        save.click()
        error.wait_for()
        assert error.inner_text() == ('Not valid JSON at line 1, column 9: expected a value, '
                                      'found "n". Nothing was saved.')
        page.wait_for_timeout(500)
        assert writes == [] and kv.get("retries").revision == first

        # A good value: a PUT with If-Match, the revision the editor opened on.
        editor.fill('{"max": 5}')
        save.click()
        wait_until(lambda: "saved 'retries'" in page.get_by_test_id("toast").inner_text(), 10,
                   what="the save")
        assert error.is_hidden()
        stored = kv.get("retries")
        assert stored.value == {"max": 5}
        assert [w.method for w in writes] == ["PUT"]
        assert writes[0].headers["if-match"] == f'"{first}"'
        wait_until(lambda: row.get_attribute("data-revision") == str(stored.revision), 10,
                   what="the new revision")
        assert row.get_by_test_id("key-value").inner_text() == '{"max":5}'

        # A change made through the client while the editor is open: the poll warns and
        # keeps the text, and the save is refused with the revisions named.
        row.get_by_test_id("key-edit").click()
        assert editor.input_value() == '{\n  "max": 5\n}'
        editor.fill('{"max": 6}')
        other = kv.put("retries", {"max": 7})
        stale = page.get_by_test_id("editor-stale")
        stale.wait_for()
        assert f"revision {other} now, not {stored.revision}" in stale.inner_text()
        assert editor.input_value() == '{"max": 6}'
        save.click()
        error.wait_for()
        assert "Not saved" in error.inner_text()
        assert f"is at revision {other}, not {stored.revision}" in error.inner_text()
        assert writes[-1].headers["if-match"] == f'"{stored.revision}"'
        assert kv.get("retries").value == {"max": 7}
        assert editor.input_value() == '{"max": 6}'
        # Start again from the value there now, and save over it.
        page.get_by_test_id("value-reload").click()
        wait_until(lambda: editor.input_value() == '{\n  "max": 7\n}', 10,
                   what="the current value in the editor")
        editor.fill("8")
        save.click()
        wait_until(lambda: kv.get("retries").value == 8, 10, what="the second save")


def test_delete_a_key_after_the_confirmation(page, dash_broker):
    deletes = []
    page.on("request", lambda r: deletes.append(r) if r.method == "DELETE" else None)
    with minou.connect_sync(dash_broker.url, **dash_broker.admin_auth()) as c:
        kv = c.kv("flags")
        kv.put("keep", 1)
        rev = kv.put("obsolete", True)
        sign_in(page, dash_broker)
        _bucket_page(page, dash_broker, "flags")
        row = _kv_row(page, "obsolete")
        wait_until(lambda: row.get_attribute("data-revision") == str(rev), 10, what="the key")
        row.get_by_test_id("key-delete").click()
        dialog = page.get_by_test_id("confirm-dialog")
        dialog.wait_for()
        assert "obsolete" in dialog.inner_text()
        page.get_by_test_id("confirm-no").click()
        time.sleep(0.5)
        assert kv.get("obsolete") is not None  # cancelled: nothing sent
        row.get_by_test_id("key-delete").click()
        page.get_by_test_id("confirm-yes").click()
        wait_until(lambda: "deleted 'obsolete'" in page.get_by_test_id("toast").inner_text(),
                   10, what="the delete")
        assert kv.get("obsolete") is None
        assert [d.headers.get("if-match") for d in deletes] == [f'"{rev}"']
        assert [e.op for e in kv.history("obsolete")][-1] == "del"
        wait_until(lambda: row.count() == 0, 10, what="the key to leave the table")
        assert _kv_row(page, "keep").count() == 1


def test_the_bucket_page_in_the_dark_on_a_phone(browser, dash_broker):
    with minou.connect_sync(dash_broker.url, **dash_broker.admin_auth()) as c:
        c.kv("phone").put("a-rather-long-key/with/parts", {"text": "x" * 300})
    context = browser.new_context(viewport={"width": 390, "height": 844}, color_scheme="dark")
    page = context.new_page()
    page.set_default_timeout(10_000)
    try:
        sign_in(page, dash_broker)
        _bucket_page(page, dash_broker, "phone")
        row = _kv_row(page, "a-rather-long-key/with/parts")
        row.get_by_test_id("key-edit").click()
        editor = page.get_by_test_id("value-input")
        assert '"text"' in editor.input_value()
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 400, "the bucket page overflows a phone screen"
        background = editor.evaluate("(e) => getComputedStyle(e).backgroundColor")
        r, g, b = (int(x) for x in background.strip("rgba()").split(",")[:3])
        assert r + g + b < 200, background  # the editor is dark too
        shot(page, "bucket-phone-dark")
    finally:
        context.close()


def test_the_federation_page_without_a_link_says_how_to_declare_one(page, dash_broker):
    sign_in(page, dash_broker)
    page.get_by_test_id("nav-federation").click()
    none = page.get_by_test_id("federation-none")
    none.wait_for()
    assert page.get_by_test_id("nav-federation").get_attribute("aria-current") == "page"
    assert page.title() == "Federation · minou"
    assert "[[federation]]" in none.inner_text() and "docs/federation.md" in none.inner_text()
    assert page.get_by_test_id("federation-link").count() == 0


def _pipe(page, name: str, direction: str):
    return page.locator(f'[data-testid=federation-link][data-link="{name}"] '
                        f'[data-testid=pipes-table] tr[data-direction="{direction}"]')


def _text(row, testid: str) -> str:
    return row.get_by_test_id(testid).inner_text().strip()


def _rgb_sum(page, expression: str) -> int:
    colour = page.evaluate(f"getComputedStyle({expression}).backgroundColor")
    return sum(int(x) for x in colour.strip("rgba()").split(",")[:3])


@pytest.mark.timeout(180)
def test_the_federation_page_shows_each_link_its_directions_and_a_remote_down(browser,
                                                                               tmp_path):
    """Broker eu has a link to us (push orders/v1/*, invoices/v1/*; pull prices/v1/*),
    one to a port nobody listens on (push and pull), and one whose identity on us may
    not write the channel it pushes: the page shows both directions of the first up,
    with what they carried and the dead letter us refused; the second retrying, with
    the connection error in full and its pull's lag not counted; the third up with its
    refused channel; each with the pages it aborted (orphans); in the dark on a phone
    too."""
    down = free_port()  # nobody listens there
    # us: everyone may do everything but "ruled", which may not write secret/v1.
    us_config = tmp_path / "us.toml"
    us_config.write_text(
        'broker_id = "us"\n[channels."invoices/v1"]\n'
        'schema = { type = "object", required = ["id"] }\n'
        + "".join(f'[[rules]]\nclient = "{c}"\nread = ["*"]\nwrite = ["*"]\n'
                  for c in ("bridge", "y"))
        + '[[rules]]\nclient = "ruled"\nread = ["*"]\nwrite = ["orders/*"]\n')
    us = BrokerProcess(tmp_path / "us", config=us_config).start()
    eu = start(tmp_path, "eu", link("eu-us", us.url, push=["orders/v1/*", "invoices/v1/*"],
                                    pull=["prices/v1/*"])
               + link("eu-down", f"minou://127.0.0.1:{down}", push=["audit/v1/*"],
                      pull=["news/v1/*"])
               + link("eu-ruled", us.url, push=["secret/v1/*"], client="ruled"))
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(10_000)
    try:
        with eu.connect_sync("x") as x:
            for n in range(5):
                x.send("orders/v1/1", n)
            x.send("invoices/v1/1", "not an invoice")  # refused by us: dead-lettered here
            x.send("secret/v1/1", "not for ruled")  # "ruled" may not write it there
        with us.connect_sync("y") as y:
            y.send_many([("prices/v1/tea", 4.2), ("prices/v1/tea", 4.3)])
        sign_in(page, eu, admin_token(eu, "eu"))
        page.get_by_test_id("nav-federation").click()
        card = page.locator('[data-testid=federation-link][data-link="eu-us"]')
        card.wait_for()
        assert page.get_by_test_id("federation-none").is_hidden()
        assert _text(card, "link-remote") == us.url
        assert _text(card, "link-prefix") == "no prefix"
        push, pull = _pipe(page, "eu-us", "push"), _pipe(page, "eu-us", "pull")
        wait_until(lambda: _text(push, "pipe-forwarded") == "5" and
                   _text(pull, "pipe-forwarded") == "2", 30, what="the messages carried")
        assert _text(push, "pipe-rate").endswith("msg/s")  # carried over the last 10 s
        for row in (push, pull):
            assert row.get_attribute("data-state") == "up"
            state = row.get_by_test_id("pipe-state")
            assert state.inner_text().strip() == "up"
            assert "badge-ok" in state.get_attribute("class").split()
            assert re.fullmatch(r"since (just now|\d+ (s|min) ago)", _text(row, "pipe-since"))
            assert row.get_by_test_id("pipe-error").is_hidden()  # up, nothing failed
            assert _text(row, "pipe-lag") == "0 msg · 0 s"
            assert _text(row, "pipe-skipped") == "0"
            assert _text(row, "pipe-refused") == "0"  # the status's refused_channels
            assert _text(row, "pipe-orphans") == "0"  # and orphans_dropped ("—": absent)
        assert _text(push, "pipe-direction") == "push" and _text(pull, "pipe-direction") == "pull"
        assert push.get_by_test_id("pipe-patterns").locator("code").all_inner_texts() == [
            "orders/v1/*", "invoices/v1/*"]
        assert pull.get_by_test_id("pipe-patterns").locator("code").all_inner_texts() == [
            "prices/v1/*"]
        assert "from here to us" in push.inner_text()
        assert "from us to here" in pull.inner_text()
        wait_until(lambda: _text(push, "pipe-dead") == "1", 30, what="the dead letter")
        assert _text(pull, "pipe-dead") == "0"
        assert pull.get_by_test_id("pipe-dead-link").count() == 0
        hrefs = push.get_by_test_id("pipe-dead-link").evaluate_all(
            "(els) => els.map((e) => e.getAttribute('href'))")
        assert hrefs == ["#/queues/_dead/orders/v1", "#/queues/_dead/invoices/v1"], hrefs

        ruled = _pipe(page, "eu-ruled", "push")
        wait_until(lambda: _text(ruled, "pipe-refused") == "1", 30,
                   what="the channel us refuses counted")
        assert "warn-text" in ruled.get_by_test_id("pipe-refused").get_attribute("class")
        assert ruled.get_attribute("data-state") == "up"  # the other channels would go on
        assert "secret/v1/1" in _text(ruled, "pipe-error")
        assert _text(ruled, "pipe-orphans") == "0"
        headers = page.locator('[data-link="eu-ruled"] [data-testid=pipes-table] th')
        assert {"Refused channels", "Orphans dropped"} <= {
            t.strip() for t in headers.all_inner_texts()}

        gone = _pipe(page, "eu-down", "push")
        wait_until(lambda: gone.get_attribute("data-state") == "retrying", 15,
                   what="the link to the port nobody listens on retrying")
        gone_pull = _pipe(page, "eu-down", "pull")
        wait_until(lambda: gone_pull.get_attribute("data-state") == "retrying", 15,
                   what="its pull retrying")
        # A pull that never reached its remote: nothing counted there, its age grows.
        assert _text(gone_pull, "pipe-lag").startswith("? msg · ")
        assert _text(gone_pull, "pipe-lag-known") == "not counted yet"
        assert gone_pull.get_by_test_id("pipe-lag").get_attribute("data-last-known") == ""
        assert push.get_by_test_id("pipe-lag-known").is_hidden()  # counted now
        state = gone.get_by_test_id("pipe-state")
        assert state.inner_text().strip() == "retrying"
        assert "badge-danger" in state.get_attribute("class").split()
        error = gone.get_by_test_id("pipe-error")
        assert error.is_visible()
        assert f"cannot connect to minou://127.0.0.1:{down}" in error.inner_text()
        assert "Connection refused" in error.inner_text()
        assert _text(gone, "pipe-forwarded") == "0"
        assert _text(page.locator('[data-link="eu-down"]'), "link-remote") == \
            f"minou://127.0.0.1:{down}"
        assert re.search(r"3 links · 5 directions: 3 up, 2 retrying",
                         page.locator(".page-head .sub").inner_text())
        shot(page, "federation")

        # The dead-letter link opens the dead letters of the channel's queue.
        push.get_by_test_id("pipe-dead-link").nth(1).click()
        wait_until(lambda: page.get_by_test_id("queue-title").inner_text().strip() ==
                   "_dead/invoices/v1", 10, what="the dead-letter queue page")
        page.locator('[data-testid=channel][data-channel="1"]').click()
        row = page.get_by_test_id("message-row").first
        row.wait_for()
        # a dead letter's line says why and where from
        assert row.locator("[data-field=source]").inner_text() == "invoices/v1/1"
        assert row.locator("[data-field=reason]").inner_text() != "—"
        row.locator("summary").click()
        assert '"not an invoice"' in page.get_by_test_id("message-payload").first.inner_text()

        # In the dark, on a phone: nothing overflows, the error is there in full.
        phone = browser.new_context(viewport={"width": 390, "height": 844},
                                    color_scheme="dark")
        small = phone.new_page()
        small.set_default_timeout(10_000)
        try:
            sign_in(small, eu, admin_token(eu, "eu"))
            small.goto(eu.http + "/#/federation")
            row = _pipe(small, "eu-down", "push")
            wait_until(lambda: row.get_attribute("data-state") == "retrying", 15,
                       what="the retrying link on the phone")
            assert "Connection refused" in row.get_by_test_id("pipe-error").inner_text()
            assert small.evaluate("document.documentElement.scrollWidth") <= 400, \
                "the federation page overflows a phone screen"
            assert _rgb_sum(small, "document.body") < 200  # dark
            card_sum = _rgb_sum(small, "document.querySelector('[data-link=\"eu-us\"]')")
            assert card_sum < 200  # the cards are dark too
            shot(small, "federation-phone-dark")
        finally:
            phone.close()
    finally:
        context.close()
        eu.stop()
        us.stop()


def _refused_unauthenticated(broker: BrokerProcess) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(broker.http + "/metrics", headers={
        "Authorization": f"Bearer {admin_token(broker)}"}).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "minou_requests_refused_total"
               and s.labels.get("reason") == "not_authenticated")


def test_loading_the_dashboard_counts_no_refusal_and_logs_nothing(browser, tmp_path):
    """Before sign-in the page asks /health whether a token is needed: no 401, no
    refused request counted, nothing in the console; signed in, neither."""
    broker = BrokerProcess(tmp_path / "quiet").start()
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    try:
        before = _refused_unauthenticated(broker)
        for _ in range(3):
            page.goto(broker.http + "/")
            page.get_by_test_id("signin").wait_for()
        sign_in(page, broker)
        page.get_by_test_id("nav-queues").click()
        page.get_by_test_id("queue-filter").wait_for()
        assert _refused_unauthenticated(broker) == before
        assert console == []
        assert page.get_by_test_id("session-note").is_hidden()  # 10 min left: no notice
    finally:
        context.close()
        broker.kill()


def test_a_session_near_its_end_says_so_then_goes_back_to_sign_in(page, dash_broker):
    key = keyfiles.load_private(dash_broker.admin_key)
    sign_in(page, dash_broker, make_token("admin", key, "minou", ttl=200))
    note = page.get_by_test_id("session-note")
    note.wait_for()
    assert re.search(r"Your session ends in [34] min \(the token expires at .+\): sign in "
                     "again", note.inner_text()), note.inner_text()
    page.get_by_test_id("signout").click()
    sign_in(page, dash_broker, make_token("admin", key, "minou", ttl=8))
    page.get_by_test_id("signin-error").wait_for(timeout=30_000)
    assert "Your token expired at" in page.get_by_test_id("signin-error").inner_text()


def test_static_assets_are_compressed_and_cached_by_build(dash_broker):
    """index.html is never cached and names every file under /assets/<build>/, served
    gzip'd (when asked) with a year's immutable cache; plain paths answer uncached."""
    import gzip

    from minou.dashboard import STATIC_DIR

    index = httpx.get(dash_broker.http + "/")
    assert index.headers["cache-control"] == "no-cache"
    assert "default-src 'self'" in index.headers["content-security-policy"]
    linked = re.findall(r'(?:href|src)="(/assets/[0-9a-f]{12}/[^"]+)"', index.text)
    assert {link.split("/", 3)[3] for link in linked} >= {
        "style.css", "js/app.js", "js/theme-init.js", "vendor/uPlot.iife.min.js",
        "favicon.svg"}
    raw = packed = 0
    with httpx.Client(base_url=dash_broker.http) as http:
        for link in linked:
            name = link.split("/", 3)[3]
            on_disk = (STATIC_DIR / name).read_bytes()
            r = http.get(link, headers={"Accept-Encoding": "gzip"})
            assert r.status_code == 200 and r.content == on_disk  # httpx un-gzips
            assert r.headers["cache-control"] == "public, max-age=31536000, immutable"
            if len(on_disk) > 4096:
                assert r.headers["content-encoding"] == "gzip", name
                raw += len(on_disk)
                packed += len(gzip.compress(on_disk))
            plain = http.get(link, headers={"Accept-Encoding": "identity"})
            assert "content-encoding" not in plain.headers and plain.content == on_disk
            again = http.get(link, headers={"If-None-Match": r.headers["etag"]})
            assert again.status_code == 304 and again.content == b""
        module = http.get(linked[0].rsplit("/", 1)[0] + "/js/pages/queue.js")
        assert module.headers["content-type"].startswith("text/javascript")  # an import
        old = http.get("/assets/000000000000/style.css")  # a page from an older build
        assert old.status_code == 200 and old.headers["cache-control"] == "no-cache"
        assert http.get("/style.css").headers["cache-control"] == "no-cache"
        assert http.get("/assets/nope/none.js").status_code == 404
        refused = http.post("/style.css")
        assert refused.status_code == 400 and "POST is not allowed" in refused.text
    assert packed < raw / 2


def test_dead_letters_are_a_view_of_their_own(page, dash_broker):
    """A dead-letter queue: its reason and source channel on each line, one message
    requeued or deleted (after a confirmation), bulk actions off when it is empty, no
    "never subscribed" warning, and a requeue counted as a requeue, not a publish."""
    from prometheus_client.parser import text_string_to_metric_families

    def counter(name: str) -> float:
        text = httpx.get(dash_broker.http + "/metrics", headers={
            "Authorization": f"Bearer {admin_token(dash_broker)}"}).text
        return sum(s.value for fam in text_string_to_metric_families(text)
                   for s in fam.samples if s.name == name)

    with minou.connect_sync(dash_broker.url, **auth("app-dlq")) as c:
        for n in (1, 2):
            c.send("orders/v1/dlq", {"total": n})
        sub = c.consume("orders/v1/dlq", group="dlq-workers")
        for _ in range(2):
            assert sub.get(timeout=5).nack()  # requeue_limit 0: dead letters
        sign_in(page, dash_broker)
        page.goto(dash_broker.http + "/#/queues/_dead/orders/v1")
        page.locator('[data-testid=channel][data-channel="dlq"]').click()
        rows = page.get_by_test_id("message-row")
        wait_until(lambda: rows.count() == 2, 10, what="two dead letters")
        diagnosis = page.get_by_test_id("diagnosis").inner_text()
        assert "never subscribed" not in diagnosis and "dead letter(s) of orders/v1" in diagnosis
        for row in rows.all():
            assert row.locator("[data-field=reason]").inner_text() == "requeue_limit"
            assert row.locator("[data-field=source]").inner_text() == "orders/v1/dlq"
        published = counter("minou_messages_published_total")
        first = rows.first
        first.locator("summary").click()
        assert "without an ack" in first.locator("[data-field=why]").inner_text()
        first.get_by_test_id("message-requeue").click()
        page.get_by_test_id("confirm-yes").click()
        wait_until(lambda: "requeued message" in page.get_by_test_id("toast").inner_text(), 10,
                   what="the requeue")
        back = sub.get(timeout=5)
        assert back.payload["total"] in (1, 2) and back.ack()
        wait_until(lambda: rows.count() == 1, 10, what="one dead letter left")
        second = rows.first
        second.locator("summary").click()
        second.get_by_test_id("message-delete").click()
        assert "cannot be undone" in page.get_by_test_id("confirm-dialog").inner_text()
        page.get_by_test_id("confirm-yes").click()
        wait_until(lambda: rows.count() == 0, 10, what="no dead letter left")
        wait_until(lambda: page.get_by_test_id("dead-requeue").is_disabled(), 10,
                   what="the bulk actions off")
        assert page.get_by_test_id("dead-purge").is_disabled()
        assert counter("minou_messages_requeued_total") >= 1
        # the requeue is no publish (the dead letters' copies were counted before)
        assert counter("minou_messages_published_total") == published


def test_the_clients_page_of_a_crowded_broker_shows_the_first_page_and_how_many_more(
        browser, tmp_path):
    """GET /v1/clients answers a page (1,000 clients): the page shows the total and
    says how many it does not list (a broker's 200,000, listed whole, were one answer
    over the frame limit)."""
    broker = start_dashboard_broker(tmp_path)
    try:
        stage_clients(broker, client_ids(1_200))
        context = browser.new_context(viewport={"width": 1280, "height": 860})
        page = context.new_page()
        page.set_default_timeout(20_000)
        sign_in(page, broker)
        page.get_by_test_id("nav-clients").click()
        count = page.get_by_test_id("clients-count")
        wait_until(lambda: count.inner_text().strip() == "1201", 20, what="the total")
        extra = page.locator(".card.stat", has=count).locator(".extra").inner_text()
        assert "201 more not listed" in extra, extra
        page.locator('tr[data-client="reg-00998"]').wait_for()  # on the first page
        assert page.locator('tr[data-client="reg-01100"]').count() == 0
        context.close()
    finally:
        broker.kill()
