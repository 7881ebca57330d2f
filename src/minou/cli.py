"""The ``minou`` command line: merges flags, env and the config file into Settings."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from . import __version__
from .config import load_settings
from .errors import ConfigError, MinouError

DEFAULT_URL = "minou://127.0.0.1:7700"
url_option = click.option(
    "--url", "-u", envvar="MINOU_URL", default=DEFAULT_URL, show_default=True,
    help="Broker URL(s), comma separated (env MINOU_URL).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
err = Console(stderr=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="minou")
def main() -> None:
    """minou: a small, durable, secure message broker."""


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


@main.command()
@click.option("--config", "-c", "config", type=click.Path(dir_okay=False),
              help="Config file (TOML or JSON); see examples/minou.toml.")
@click.option("--data", "data_dir", help="Data directory (default ./data).")
@click.option("--host", help="Address to listen on (default 127.0.0.1).")
@click.option("--port", type=int, help="Native protocol port (default 7700; 0 = any free).")
@click.option("--http-port", type=int, help="HTTP/WebSocket port (default 7701; 0 = any free).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def start(config: str | None, data_dir: str | None, host: str | None, port: int | None,
          http_port: int | None, log_level: str) -> None:
    """Run a broker in the foreground until SIGTERM or Ctrl-C."""
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(config, data_dir=data_dir, host=host, port=port,
                                 http_port=http_port)
    except ConfigError as exc:
        err.print(f"[red]invalid configuration:[/red] {exc}")
        sys.exit(2)
    from .server.app import run_broker

    def announce(server: Any) -> None:
        st = server.status()
        print(f"minou {__version__} broker {st['broker_id']!r} ready", flush=True)
        print(f"  native  {st['native']}", flush=True)
        if st["http"]:
            print(f"  http    {st['http']}   (GET /health)", flush=True)
        print(f"  data    {st['storage']['path']}", flush=True)
        print("  stop with Ctrl-C", flush=True)

    _install_uvloop()
    try:
        code = asyncio.run(run_broker(settings, announce=announce))
    except OSError as exc:
        err.print(f"[red]cannot start:[/red] {exc}")
        sys.exit(1)
    except MinouError as exc:
        err.print(f"[red]cannot start:[/red] {exc}")
        sys.exit(1)
    sys.exit(code)


def _client(url: str) -> Any:
    from .client.sync import connect_sync

    try:
        return connect_sync(url, reconnect=False, request_timeout=5)
    except MinouError as exc:
        err.print(f"[red]no broker answered at {url}[/red]: {exc}")
        sys.exit(3)


@main.command()
@url_option
@click.argument("channel")
@click.argument("payload")
@click.option("--header", "-H", multiple=True, help="KEY=VALUE (repeatable).")
@click.option("--priority", type=int, default=0, help="0..9, higher first.")
@click.option("--ttl", type=float, help="Seconds before the message expires.")
@click.option("--delay", type=float, help="Seconds before it may be delivered.")
@click.option("--dedup", help="Dedup key: a repeat within the window is dropped.")
@json_option
def publish(url: str, channel: str, payload: str, header: tuple[str, ...], priority: int,
            ttl: float | None, delay: float | None, dedup: str | None, as_json: bool) -> None:
    """Publish PAYLOAD (JSON text) to CHANNEL; waits until it is durable."""
    try:
        value = json.loads(payload)
    except json.JSONDecodeError as exc:
        err.print(f"[red]PAYLOAD is not valid JSON:[/red] {exc} (quote strings: '\"text\"')")
        sys.exit(2)
    headers = {}
    for h in header:
        key, sep, val = h.partition("=")
        if not sep:
            err.print(f"[red]--header {h!r}: expected KEY=VALUE[/red]")
            sys.exit(2)
        headers[key] = val
    with _client(url) as client:
        try:
            r = client.send(channel, value, headers=headers or None, priority=priority,
                            ttl=ttl, delay=delay, dedup=dedup)
        except MinouError as exc:
            err.print(f"[red]refused:[/red] {exc}")
            sys.exit(1)
    if as_json:
        click.echo(json.dumps({"channel": r.channel, "seq": r.seq, "id": r.id,
                               "duplicate": r.duplicate, "fanout": r.fanout}))
    else:
        extra = " (duplicate, dropped)" if r.duplicate else ""
        if channel.endswith("*"):
            extra += f" to {r.fanout} channel(s)"
        click.echo(f"stored {r.channel} seq={r.seq} id={r.id}{extra}")


@main.command()
@url_option
@click.argument("pattern")
@click.option("--group", "-g", help="Consumer group (default: the pattern).")
@click.option("--count", "-n", type=int, default=0, help="Stop after N messages (0 = forever).")
@click.option("--timeout", type=float, default=0.0,
              help="Stop when nothing arrives for this many seconds (0 = wait forever).")
@click.option("--no-ack", is_flag=True, help="Return the messages instead of acking them.")
@json_option
def consume(url: str, pattern: str, group: str | None, count: int, timeout: float,
            no_ack: bool, as_json: bool) -> None:
    """Consume from PATTERN as a competing consumer, acking each message."""
    from .errors import Timeout

    seen = 0
    with _client(url) as client:
        try:
            sub = client.consume(pattern, group=group, prefetch=max(1, min(count or 100, 100)))
        except MinouError as exc:
            err.print(f"[red]refused:[/red] {exc}")
            sys.exit(1)
        try:
            while not count or seen < count:
                try:
                    msg = sub.get(timeout or None)
                except Timeout:
                    break
                _print_message(msg, as_json)
                if no_ack:
                    msg.nack()
                else:
                    msg.ack()
                seen += 1
        except KeyboardInterrupt:
            pass


def _print_message(msg: Any, as_json: bool) -> None:
    payload = msg.payload if not msg.raw else msg.data.decode("utf-8", "replace")
    if as_json:
        click.echo(json.dumps({"channel": msg.channel, "seq": msg.seq, "id": msg.id,
                               "attempts": msg.attempts, "headers": msg.headers,
                               "payload": payload}), nl=True)
    else:
        click.echo(f"{msg.channel} seq={msg.seq} attempts={msg.attempts} "
                   f"{json.dumps(payload)}")


@main.command(name="list")
@url_option
@click.option("--channel", "-C", default="", help="Only channels starting with this.")
@json_option
def list_(url: str, channel: str, as_json: bool) -> None:
    """List channels and reader groups with their depth and unsettled counts."""
    with _client(url) as client:
        data = client.admin("list", channel=channel)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    console = Console()
    table = Table(title="channels")
    for col in ("channel", "depth", "unsettled", "next seq", "readers"):
        table.add_column(col, justify="right" if col in ("depth", "unsettled", "next seq")
                         else "left")
    for ch in data["channels"]:
        table.add_row(ch["channel"], str(ch["depth"]), str(ch["unsettled"]),
                      str(ch["next_seq"]), ", ".join(ch["readers"]) or "-")
    console.print(table)
    groups = Table(title="groups")
    for col in ("group", "kind", "patterns", "members", "lag", "unsettled"):
        groups.add_column(col)
    for g in data["groups"]:
        groups.add_row(g["group"], g["kind"], ", ".join(g["patterns"]), str(g["members"]),
                       str(g["lag"]), str(g["unsettled"]))
    console.print(groups)


@main.command()
@click.argument("client_id")
@click.option("--out", "out_dir", default="keys", show_default=True,
              type=click.Path(file_okay=False), help="Directory for the key files.")
def keygen(client_id: str, out_dir: str) -> None:
    """Make an Ed25519 key pair for CLIENT_ID: CLIENT_ID.key (mode 0600) and .pub."""
    from .auth import keys

    if not client_id or "/" in client_id or len(client_id) > 200:
        err.print("[red]CLIENT_ID must be 1..200 characters without '/'[/red]")
        sys.exit(2)
    key = keys.generate()
    try:
        private, public = keys.save(key, out_dir, client_id)
    except ConfigError as exc:
        err.print(f"[red]{exc}[/red]")
        sys.exit(1)
    click.echo(f"private key  {private}  (keep it secret: mode 0600)")
    click.echo(f"public key   {public}")
    click.echo(f"fingerprint  {keys.fingerprint(key)}")
    click.echo("the client signs short-lived tokens with the private key; the broker knows it by "
               "the public key")


@main.command()
@url_option
@json_option
def status(url: str, as_json: bool) -> None:
    """Show the broker's identity, uptime, storage and counters."""
    with _client(url) as client:
        st = client.admin("status")
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    console = Console()
    table = Table(show_header=False, title=f"minou {st['version']} — {st['broker_id']}")
    table.add_column("key", style="bold")
    table.add_column("value")
    table.add_row("uptime", f"{st['uptime_s']:.0f} s")
    table.add_row("native", str(st["native"]))
    table.add_row("http", str(st["http"]))
    table.add_row("storage", f"{st['storage']['backend']} {st['storage']['path']} "
                             f"({st['storage']['bytes'] / 1e6:.1f} MB)")
    table.add_row("connections", str(st["connections"]))
    table.add_row("channels / groups", f"{st['channels']} / {st['groups']}")
    for key, value in st["counters"].items():
        table.add_row(key, json.dumps(value) if isinstance(value, dict) else str(value))
    console.print(table)


if __name__ == "__main__":
    main()
