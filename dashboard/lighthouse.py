"""Lighthouse over every page of the dashboard, desktop and mobile: a table of the
accessibility, best-practices and performance scores and the layout shift (CLS).

    .venv/bin/python dashboard/lighthouse.py            # npx lighthouse@12.8.2
    .venv/bin/python dashboard/lighthouse.py clients queue   # some pages only
    LIGHTHOUSE=/path/to/lighthouse .venv/bin/python dashboard/lighthouse.py

It starts its own broker in development mode (no sign-in: Lighthouse cannot type a
token) on free loopback ports, gives it traffic, a dead letter and a bucket, and runs
Debian's chromium headless (``CHROME_PATH``, default /usr/bin/chromium). Needs node and
npm (the first run downloads Lighthouse). Results go in docs/dashboard.md by hand.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PAGES = {
    "sign-in": "",  # on a second broker that asks for a token
    "overview": "#/overview",
    "queues": "#/queues",
    "queue": "#/queues/orders/v1",
    "dead letters": "#/queues/_dead/orders/v1",
    "buckets": "#/kv",
    "bucket": "#/kv/config",
    "clients": "#/clients",
    "cluster": "#/cluster",
    "federation": "#/federation",
}
CONFIG = """
[channels."orders/v1"]
requeue_limit = 0

[kv."config"]
history = 5
"""
ADDRESS = re.compile(r"^\s+(native|http)\s+(\S+)")


def start_broker(base: Path, *, dev: bool = True) -> tuple[subprocess.Popen[str], str, str]:
    base.mkdir(parents=True, exist_ok=True)
    (base / "minou.toml").write_text(CONFIG)
    log = open(base / "broker.log", "w")  # noqa: SIM115 (the broker's whole life)
    proc = subprocess.Popen(
        [sys.executable, "-m", "minou", "start", *(["--dev"] if dev else []),
         "--data", str(base / "data"),
         "--port", "0", "--http-port", "0", "--log-level", "warning",
         "--config", str(base / "minou.toml")], stdout=log, stderr=subprocess.STDOUT,
        text=True)
    found: dict[str, str] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(found) < 2:
        for line in (base / "broker.log").read_text().splitlines():
            m = ADDRESS.match(line)
            if m:
                found[m.group(1)] = m.group(2)
        if proc.poll() is not None:
            sys.exit("the broker did not start:\n" + (base / "broker.log").read_text())
        time.sleep(0.1)
    return proc, found["native"], found["http"]


def give_it_traffic(url: str) -> None:
    import minou

    with minou.connect_sync(url) as c:
        c.send_many([("orders/v1/eu", {"total": i, "note": "x" * (i % 30)})
                     for i in range(200)])
        c.send("orders/v1/dead", {"total": 1})
        sub = c.consume("orders/v1/dead", group="workers")
        sub.get(timeout=5).nack()  # requeue_limit 0: a dead letter
        c.kv("config").put("feature.flag", {"on": True})


def lighthouse(url: str, mobile: bool) -> dict[str, float]:
    command = shlex.split(os.environ.get("LIGHTHOUSE", "npx --yes lighthouse@12.8.2"))
    out = subprocess.run(
        [*command, url, "--quiet", "--output=json", "--output-path=stdout",
         "--only-categories=performance,accessibility,best-practices",
         "--chrome-flags=--headless=new --no-sandbox --disable-dev-shm-usage",
         *([] if mobile else ["--preset=desktop"])],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "CHROME_PATH": os.environ.get("CHROME_PATH", "/usr/bin/chromium")})
    if out.returncode != 0:
        sys.exit(f"lighthouse failed on {url}:\n{out.stderr[-2000:]}")
    report = json.loads(out.stdout)
    cats = report["categories"]
    cls = report["audits"]["cumulative-layout-shift"]["numericValue"]
    return {"accessibility": cats["accessibility"]["score"] * 100,
            "best-practices": cats["best-practices"]["score"] * 100,
            "performance": cats["performance"]["score"] * 100, "cls": cls}


def main() -> None:
    if shutil.which("npx") is None and "LIGHTHOUSE" not in os.environ:
        sys.exit("needs node and npm (npx), or LIGHTHOUSE=/path/to/lighthouse")
    with tempfile.TemporaryDirectory(prefix="minou-lighthouse-") as tmp:
        proc, url, http = start_broker(Path(tmp) / "dev")
        locked, _, locked_http = start_broker(Path(tmp) / "locked", dev=False)
        try:
            give_it_traffic(url)
            print("| page | form | accessibility | best practices | performance | CLS |")
            print("|---|---|---:|---:|---:|---:|")
            wanted = sys.argv[1:] or list(PAGES)
            for name, route in PAGES.items():
                if name not in wanted:
                    continue
                for mobile in (False, True):
                    base = locked_http if name == "sign-in" else http
                    r = lighthouse(f"{base}/{route}", mobile)
                    print(f"| {name} | {'mobile' if mobile else 'desktop'} | "
                          f"{r['accessibility']:.0f} | {r['best-practices']:.0f} | "
                          f"{r['performance']:.0f} | {r['cls']:.3f} |", flush=True)
        finally:
            for p in (proc, locked):
                p.terminate()
                p.wait(10)


if __name__ == "__main__":
    main()
