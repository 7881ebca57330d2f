"""The ``minou`` command line: merges flags, env and the config file into Settings."""

from __future__ import annotations

import asyncio
import base64
import functools
import getpass
import json
import logging
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import __version__
from .cli_kv import FiniteRange, kv_group
from .config import load_settings
from .errors import BadRequest, ConfigError, MinouError
from .limits import (
    DEFAULT_ADMIN_PAGE,
    DEFAULT_REQUEST_TIMEOUT_S,
    MAX_ADMIN_PAGE,
    MAX_CLIENT_ID,
    MAX_REQUEST_TIMEOUT_S,
)

DEFAULT_URL = "minou://127.0.0.1:7700"
CONSUME_WAIT_S = 10.0  # `minou consume` gives up after this much silence (0 = never)
url_option = click.option(
    "--url", "-u", envvar="MINOU_URL", default=DEFAULT_URL, show_default=True,
    help="Broker URL(s), comma separated (env MINOU_URL).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
# Errors stay on one line for scripts. Broker and user data (ids, fingerprints, payloads)
# is never read as Rich markup or emoji codes: ":ab:" in a fingerprint became an emoji.
err = Console(stderr=True, soft_wrap=True, emoji=False, highlight=False, markup=False)


def out() -> Console:
    """The console for tables on stdout, with the same protection as ``err``."""
    return Console(emoji=False, highlight=False, markup=False)


def say(label: str, detail: object = "", style: str = "red") -> None:
    """One line on stderr: ``label`` styled, ``detail`` verbatim."""
    err.print(Text.assemble((label, style), " " if detail != "" else "", str(detail)))


def fail(label: str, detail: object = "", code: int = 1) -> NoReturn:
    say(label, detail)
    sys.exit(code)

_CONNECTION_OPTIONS = [
    click.option("--key", "-k", envvar="MINOU_KEY", type=click.Path(dir_okay=False),
                 help="Private key file (env MINOU_KEY; default: your own key, made on first "
                      "use under ~/.config/minou/keys)."),
    click.option("--client-id", envvar="MINOU_CLIENT_ID",
                 help="Client id (env MINOU_CLIENT_ID; default: the key file's name, or "
                      "cli-<user>)."),
    click.option("--broker-token", envvar="MINOU_BROKER_TOKEN",
                 help="Shared broker token, when the broker requires one "
                      "(env MINOU_BROKER_TOKEN)."),
    click.option("--tls-fingerprint", envvar="MINOU_TLS_FINGERPRINT",
                 help="Pin the broker's TLS certificate (SHA256:.. as the broker printed it)."),
    click.option("--cafile", envvar="MINOU_CAFILE", type=click.Path(dir_okay=False),
                 help="CA file to verify the broker's TLS certificate."),
]


def connection_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--url plus the identity options; the command gets them as one ``conn`` dict."""

    @functools.wraps(func)
    def wrapper(**kw: Any) -> Any:
        conn = {k: kw.pop(k) for k in ("url", "key", "client_id", "broker_token",
                                       "tls_fingerprint", "cafile")}
        return func(conn=conn, **kw)

    for option in reversed(_CONNECTION_OPTIONS):
        wrapper = option(wrapper)
    return url_option(wrapper)


def _user_key_path(client_id: str) -> Path:
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "minou" / "keys" / f"{client_id}.key"


def _default_client_id() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "user"
    return f"cli-{user}"


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
@click.option("--resp-port", type=int,
              help="Redis protocol port (off unless set; 0 = any free): redis-cli and "
                   "redis-py work against it, see docs/redis-protocol.md.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--dev", is_flag=True,
              help="Development mode: no authentication, loopback only (what `make run` uses).")
@click.option("--storage", "storage_url", metavar="URL",
              help="Storage backend (config [storage] url): sqlite:///path/minou.db, "
                   "redis://[:password@]host:6379/0 (rediss:// for TLS; "
                   "?password_file=PATH, ?replicas=N), "
                   "redis+sentinel://h1:26379,h2:26379/mymaster/0, "
                   "redis+cluster://h1:7000,h2:7001; default: minou.db in "
                   "the data directory.")
def start(config: str | None, data_dir: str | None, host: str | None, port: int | None,
          http_port: int | None, resp_port: int | None, log_level: str, dev: bool,
          storage_url: str | None) -> None:
    """Run a broker in the foreground until SIGTERM or Ctrl-C."""
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = {"data_dir": data_dir, "host": host, "port": port, "http_port": http_port,
                 "resp_port": resp_port,
                 "auth_mode": "off" if dev else None, "storage": storage_url}
    try:
        settings = load_settings(config, **overrides)
    except ConfigError as exc:
        fail("invalid configuration:", exc, 2)
    from .server.app import run_broker

    def announce(server: Any) -> None:
        for line in banner(server.status(), settings.data_dir):
            print(line, flush=True)

    _install_uvloop()
    try:
        code = asyncio.run(run_broker(settings, announce=announce, overrides=overrides))
    except (OSError, MinouError) as exc:
        fail("cannot start:", exc)
    sys.exit(code)


def banner(st: dict[str, Any], data_dir: str) -> list[str]:
    """What a starting broker prints: where to look, and commands that work when pasted
    (this program as it was invoked, this broker's URL, its TLS pin)."""
    lines = [f"minou {__version__} broker {st['broker_id']!r} ready", f"  native  {st['native']}"]
    tls = st["tls"]
    reach = f"--url {_reachable(st['native'])}"
    if tls and tls["self_signed"]:
        reach += f" --tls-fingerprint {tls['fingerprint']}"
    prog = _prog()
    if st["http"]:
        lines.append(f"  http    {st['http']}   (GET /health, API: /openapi.json)")
        how = "no sign-in: development mode" if st["auth"]["mode"] == "off" else \
            f"sign in with the token of: {prog} admin-token --data {shlex.quote(data_dir)} {reach}"
        lines.append(f"  dashboard {_reachable(st['http'])}/   ({how})")
    if st.get("resp"):
        port = st["resp"].rsplit(":", 1)[1]
        lines.append(f"  redis   {_reachable(st['resp'])}   (Redis protocol: redis-cli -p {port}"
                     + (" --tls" if tls else "") + ")")
    if tls:
        kind = "self-signed: clients pin it with --tls-fingerprint" if tls["self_signed"] \
            else "from the config"
        lines.append(f"  tls     {tls['fingerprint']}  ({kind})")
    auth = st["auth"]
    if auth["mode"] == "off":
        lines.append("  auth    OFF: development mode, loopback only, every client is admin")
    elif auth["mode"] == "token":
        lines.append("  auth    broker token (its holders are admins)")
    else:
        extra = " + broker token" if auth["broker_token"] else ""
        lines.append(f"  auth    client key pairs{extra}; {auth['clients']} registered, "
                     f"{auth['pending']} pending")
        if auth["admin_key"]:
            key = shlex.quote(str(auth["admin_key"]))
            lines.append(f"  admin   {auth['admin_key']}  (client id 'admin'; e.g. "
                         f"{prog} clients list --key {key} {reach})")
    for line in st["schemas"]["compatibility"]:
        verdict = "compatible" if line["compatible"] else "BREAKING"
        lines.append(f"  schema  {line['old']} -> {line['new']}: {verdict}"
                     + (f" ({'; '.join(line['changes'])})" if line["changes"] else ""))
    if st.get("admission"):
        lines.append(f"  limits  {_connection_limits(st['admission'])}")
    lines.append(f"  data    {st['storage']['path']}")
    lines.append("  stop with Ctrl-C")
    return lines


def _connection_limits(adm: dict[str, Any]) -> str:
    """The connection limit and the file descriptor limit it derives from."""
    limit, configured, fds = adm["limit"], adm["max_connections"], adm["descriptors"]
    text = f"{limit} connections, native + HTTP + WebSocket"
    if not fds:
        return f"{text} (max_connections)"
    before = adm.get("descriptors_before") or fds
    raised = f", raised from {before}" if before < fds else ""
    if limit < configured:
        return (f"{text} (file descriptors: {fds}{raised}; max_connections {configured} is "
                f"capped by them: raise the hard limit, e.g. ulimit -Hn or LimitNOFILE=)")
    return f"{text} (max_connections; file descriptors: {fds}{raised})"


def _reachable(url: str) -> str:
    """A URL a local client can use: a wildcard listen address becomes loopback."""
    scheme, _, rest = url.partition("://")
    host, _, port = rest.rpartition(":")
    host = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]", "::": "[::1]"}.get(host, host)
    return f"{scheme}://{host}:{port}"


def _prog() -> str:
    """How to run this program again: ``minou`` if that is what PATH finds, else the
    path it was started by (``.venv/bin/minou`` under ``make run``)."""
    argv0 = sys.argv[0]
    if argv0.endswith("__main__.py"):
        return f"{shlex.quote(sys.executable)} -m minou"
    found = shutil.which("minou")
    if found and Path(found).resolve() == Path(argv0).resolve():
        return "minou"
    return shlex.quote(argv0) if "/" in argv0 else "minou"


def _client(conn: dict[str, Any]) -> Any:
    """Connect as the CLI user: the --key given, or the user's own key (made on first use,
    only when the broker asks for one)."""
    from .auth import keys
    from .client.sync import connect_sync
    from .errors import NotAuthenticated, PendingApproval

    url, key = conn["url"], conn["key"]
    client_id = conn["client_id"] or (Path(key).stem if key else _default_client_id())
    own = _user_key_path(client_id)
    if key is None and own.exists():
        key = str(own)
    options = {"reconnect": False, "request_timeout": 5, "client_id": client_id,
               "broker_token": conn["broker_token"], "tls_fingerprint": conn["tls_fingerprint"],
               "cafile": conn["cafile"]}
    try:
        try:
            return connect_sync(url, key=key, **options)
        except NotAuthenticated as exc:
            if key is not None or exc.detail.get("why") != "no_key":
                raise
            made = keys.generate()
            keys.save(made, own.parent, client_id)
            say("made a key for", f"{client_id}: {own} ({keys.fingerprint(made)})", "bold")
            return connect_sync(url, key=str(own), **options)
    except PendingApproval as exc:
        say("pending:", exc, "yellow")
        sys.exit(4)
    except NotAuthenticated as exc:
        fail("not authenticated:", exc, 4)
    except ConfigError as exc:  # a local mistake (key file, fingerprint, CA file)
        fail("cannot connect:", exc, 2)
    except MinouError as exc:  # "cannot connect to URL: why", from the client
        fail(str(exc), code=3)


def _admin(conn: dict[str, Any], op: str, **args: Any) -> Any:
    """Run one admin operation; a refusal is printed, not a traceback."""
    from .errors import NotFound, RequestError

    with _client(conn) as client:
        try:
            return client.admin(op, **args)
        except NotFound as exc:
            fail("not found:", exc)
        except RequestError as exc:
            fail("refused:", exc)


@main.command()
@connection_options
@click.argument("channel")
@click.argument("payload")
@click.option("--header", "-H", multiple=True, help="KEY=VALUE (repeatable).")
@click.option("--priority", type=int, default=0, help="0..9, higher first.")
@click.option("--ttl", type=float, help="Seconds before the message expires.")
@click.option("--delay", type=float, help="Seconds before it may be delivered.")
@click.option("--dedup", help="Dedup key: a repeat within the window is dropped.")
@json_option
def publish(conn: dict[str, Any], channel: str, payload: str, header: tuple[str, ...],
            priority: int, ttl: float | None, delay: float | None, dedup: str | None,
            as_json: bool) -> None:
    """Publish PAYLOAD (JSON text) to CHANNEL; waits until it is durable.

    PAYLOAD may be '-' to read the JSON from standard input, or @FILE to read it from a
    file (for payloads beyond the shell's argument limit)."""
    value = _json_payload(payload)
    headers = _headers(header)
    with _client(conn) as client:
        try:
            r = client.send(channel, value, headers=headers or None, priority=priority,
                            ttl=ttl, delay=delay, dedup=dedup)
        except MinouError as exc:
            fail("refused:", exc)
    if as_json:
        click.echo(json.dumps({"channel": r.channel, "seq": r.seq, "id": r.id,
                               "duplicate": r.duplicate, "fanout": r.fanout}))
    else:
        extra = " (duplicate, dropped)" if r.duplicate else ""
        if channel.endswith("*"):
            extra += f" to {r.fanout} channel(s)"
        click.echo(f"stored {r.channel} seq={r.seq} id={r.id}{extra}")


@main.command()
@connection_options
@click.argument("channel")
@click.argument("payload")
@click.option("--header", "-H", multiple=True, help="KEY=VALUE (repeatable).")
@click.option("--timeout", type=FiniteRange(min=0, min_open=True,
                                                 max=MAX_REQUEST_TIMEOUT_S),
              default=DEFAULT_REQUEST_TIMEOUT_S, show_default=True,
              help="Seconds to wait for the reply.")
@json_option
def request(conn: dict[str, Any], channel: str, payload: str, header: tuple[str, ...],
            timeout: float, as_json: bool) -> None:
    """Send PAYLOAD (JSON text) as a request to CHANNEL and print the reply.

    A consumer serving CHANNEL (client.serve) answers it; exit 1 with the reason when
    nobody serves the channel (no_responders), no reply comes within --timeout, or the
    responder failed. PAYLOAD may be '-' (standard input) or @FILE."""
    value = _json_payload(payload)
    headers = _headers(header)
    with _client(conn) as client:
        try:
            reply = client.request(channel, value, timeout=timeout, headers=headers or None)
        except MinouError as exc:
            fail("no reply:", exc)
    if isinstance(reply, bytes):
        click.echo(json.dumps({"raw_base64": base64.b64encode(reply).decode()}) if as_json
                   else f"<{len(reply)} raw bytes>")
    else:
        click.echo(json.dumps(reply, indent=None if as_json else 2))


def _json_payload(payload: str) -> Any:
    text = _read_payload(payload)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        fail("PAYLOAD is not valid JSON:", f"{exc} (quote strings: '\"text\"')", 2)


def _headers(header: tuple[str, ...]) -> dict[str, str]:
    headers = {}
    for h in header:
        key, sep, val = h.partition("=")
        if not sep:
            fail(f"--header {h!r}:", "expected KEY=VALUE", 2)
        headers[key] = val
    return headers


def _read_payload(payload: str) -> str:
    """'-' is standard input, '@path' a file (no JSON text starts with either)."""
    if payload == "-":
        return sys.stdin.read()
    if payload.startswith("@"):
        try:
            return Path(payload[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"cannot read the payload file {payload[1:]}:", exc, 2)
    return payload


@main.command()
@connection_options
@click.argument("pattern")
@click.option("--group", "-g", help="Consumer group (default: the pattern).")
@click.option("--count", "-n", type=click.IntRange(min=0), default=0,
              help="Stop after N messages (0 = no limit).")
@click.option("--timeout", "-t", type=FiniteRange(min=0), default=CONSUME_WAIT_S,
              show_default=True,
              help="Stop when nothing arrives for this many seconds (0 = wait until Ctrl-C).")
@click.option("--no-ack", is_flag=True, help="Return the messages instead of acking them.")
@json_option
def consume(conn: dict[str, Any], pattern: str, group: str | None, count: int, timeout: float,
            no_ack: bool, as_json: bool) -> None:
    """Consume from PATTERN as a competing consumer, acking each message.

    Stops after --count messages, or when nothing arrives for --timeout seconds, or on
    Ctrl-C; --timeout 0 follows the queue until Ctrl-C."""
    from .errors import Timeout

    seen = 0
    with _client(conn) as client:
        try:
            sub = client.consume(pattern, group=group, prefetch=max(1, min(count or 100, 100)))
        except MinouError as exc:
            fail("refused:", exc)
        try:
            while not count or seen < count:
                try:
                    msg = sub.get(timeout or None)
                except Timeout:
                    if count:
                        say(f"nothing for {timeout:g} s:", f"stopped after {seen} of {count} "
                            "message(s) (--timeout 0 waits until Ctrl-C)", "yellow")
                    break
                _print_message(msg, as_json)
                if no_ack:
                    msg.nack()
                else:
                    msg.ack()
                seen += 1
        except KeyboardInterrupt:
            pass


def _expiry(ch: dict[str, Any]) -> str:
    """When an idle channel goes (expire_idle): readers connected keep it."""
    limit = ch.get("expire_idle")
    if limit is None:
        return "-"
    left = limit - (_now() - ch.get("active_at", 0.0))
    return f"after {limit:g} s idle ({max(0.0, left):.0f} s left if nothing happens)"


def _some(names: list[str], total: int | None, shown: int = 5) -> str:
    """The first ``shown`` of ``names`` and how many more there are (``total``: all of
    them; an answer lists the first MAX_LISTED_NAMES)."""
    rest = max(total if total is not None else len(names), len(names)) - shown
    text = ", ".join(names[:shown])
    return f"{text} (+{rest} more)" if rest > 0 else text


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
@connection_options
@click.option("--queue", "-q", help="Only this queue (endpoint/version, e.g. orders/v1).")
@click.option("--channel", "-C", default="",
              help="With -q: one channel id of the queue; alone: channels starting with this.")
@click.option("--messages", "-m", is_flag=True, help="Also show the stored messages.")
@click.option("--limit", default=20, show_default=True, help="Messages shown per channel (-m).")
@json_option
def list_(conn: dict[str, Any], queue: str | None, channel: str, messages: bool, limit: int,
          as_json: bool) -> None:
    """List channels and reader groups: depth, lag, and messages in flight (delivered, not
    yet settled) (admin)."""
    data = _admin(conn, "list", channel=channel, queue=queue)
    if messages:
        for ch in data["channels"]:
            ch["messages"] = _admin(conn, "browse", channel=ch["channel"],
                                    limit=limit)["messages"]
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    console = out()
    table = Table(title="channels")
    # "in flight": delivered, not yet settled (the JSON keeps the name "unsettled").
    for col in ("channel", "depth", "in flight", "next seq", "readers", "expires if idle"):
        table.add_column(col, justify="right" if col in ("depth", "in flight", "next seq")
                         else "left")
    for ch in data["channels"]:
        table.add_row(ch["channel"], str(ch["depth"]), str(ch["unsettled"]),
                      str(ch["next_seq"]), _some(ch["readers"], ch.get("readers_total"))
                      or "-", _expiry(ch))
    console.print(table)
    groups = Table(title="groups")
    for col in ("group", "kind", "patterns", "members", "lag", "in flight"):
        groups.add_column(col)
    for g in data["groups"]:
        groups.add_row(g["group"], g["kind"], _some(g["patterns"], g.get("patterns_total")),
                       str(g["members"]),
                       str(g["lag"]), str(g["unsettled"]))
    console.print(groups)
    for ch in data["channels"] if messages else []:
        rows = Table(title=f"messages of {ch['channel']}")
        for col in ("seq", "id", "age", "attempts", "headers", "payload"):
            rows.add_column(col)
        for m in ch["messages"]:
            payload = m["payload"] if m["payload_base64"] is None else \
                f"<{m['size']} raw bytes>"
            rows.add_row(str(m["seq"]), m["id"], f"{max(0.0, _now() - m['published_at']):.0f} s",
                         str(m["attempts"]), json.dumps(m["headers"]) if m["headers"] else "",
                         json.dumps(payload)[:200])
        console.print(rows)


@main.command()
@connection_options
@click.option("--queue", "-q", required=True, help="The queue (endpoint/version).")
@click.option("--channel", "-C", help="Only this channel id of the queue.")
@click.option("--dead", is_flag=True, help="Empty the queue's dead letters instead.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
def delete(conn: dict[str, Any], queue: str, channel: str | None, dead: bool, yes: bool,
           as_json: bool) -> None:
    """Empty a queue (or one of its channels): its stored messages are removed (admin)."""
    what = f"{'dead letters of ' if dead else ''}{queue}" + (f"/{channel}" if channel else "")
    if not yes and not click.confirm(f"remove every message of {what}?"):
        sys.exit(1)
    result = _admin(conn, "dead.purge" if dead else "purge", queue=queue, channel=channel)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(f"removed {result['messages']} message(s) from {what}")


@main.command(name="soft-stop")
@connection_options
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until the broker has stopped.")
@json_option
def soft_stop(conn: dict[str, Any], wait: bool, as_json: bool) -> None:
    """Stop a broker gracefully: no new deliveries, those out settle (up to the default
    lease), everything is committed, then it exits 0 (admin). Alone it takes no new
    publishes or consumers meanwhile; with several brokers on one Redis this stops the
    primary (whichever broker --url names), which goes on taking publishes and then
    hands over to a standby at once. Stop a standby with SIGTERM."""
    import time

    result = _admin(conn, "soft_stop")
    if wait:
        from .client.sync import connect_sync

        deadline = time.monotonic() + float(result["deadline_s"]) + 30
        # The broker that is stopping: with several on one Redis, the request went to
        # the one that serves, whichever --url relayed it.
        stopping = result.get("native") or conn["url"]
        while time.monotonic() < deadline:
            try:
                connect_sync(stopping, reconnect=False, request_timeout=1,
                             client_id="soft-stop-probe", cafile=conn["cafile"],
                             tls_fingerprint=conn["tls_fingerprint"]).close()
            except MinouError as exc:
                if "no broker answered" in str(exc):
                    result["stopped"] = True
                    break
            time.sleep(0.2)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(f"stopping: {result['unsettled']} deliveries to settle (at most "
                   f"{result['deadline_s']:.0f} s)" + ("; stopped" if result.get("stopped")
                                                        else ""))


@main.command()
@connection_options
@click.option("--ttl", default=3600, show_default=True, type=click.IntRange(10, 3600),
              help="Seconds the token lives.")
def token(conn: dict[str, Any], ttl: int) -> None:
    """Print a bearer token for the HTTP API, signed with your key:
    curl -H "Authorization: Bearer $(minou token)" ..."""
    _print_token(conn, ttl)


def _print_token(conn: dict[str, Any], ttl: int) -> None:
    from .auth.tokens import make_token

    with _client(conn) as client:
        key = client._client.key
        broker_id = client._client.broker_id
        client_id = client.client_id
    if key is None:
        fail("no key:", "this broker did not ask for one (development mode needs no token)", 2)
    click.echo(make_token(client_id, key, broker_id, ttl=ttl))


@main.command(name="admin-token")
@click.option("--url", "-u", envvar="MINOU_URL", default=DEFAULT_URL, show_default=True,
              help="The broker (its id is the token's audience).")
@click.option("--data", "data_dir", default="data", show_default=True,
              type=click.Path(file_okay=False), help="The broker's data dir (admin.key).")
@click.option("--key", "-k", "key_path", envvar="MINOU_KEY",
              help="An admin's key file instead of <data>/admin.key.")
@click.option("--ttl", default=3600, show_default=True, type=click.IntRange(10, 3600),
              help="Seconds the token lives.")
@click.option("--tls-fingerprint", envvar="MINOU_TLS_FINGERPRINT", help="Pin the broker's TLS "
              "certificate.")
@click.option("--cafile", envvar="MINOU_CAFILE", help="CA file for the broker's certificate.")
def admin_token(url: str, data_dir: str, key_path: str | None, ttl: int,
                tls_fingerprint: str | None, cafile: str | None) -> None:
    """Print an admin bearer token: sign in to the dashboard with it (or use it with curl)."""
    key = key_path or str(Path(data_dir) / "admin.key")
    if not Path(key).exists():
        fail(f"no admin key at {key}:", "give --data (the broker's data dir) or --key", 2)
    conn = {"url": url, "key": key, "client_id": Path(key).stem if key_path else "admin",
            "broker_token": None, "tls_fingerprint": tls_fingerprint, "cafile": cafile}
    _print_token(conn, ttl)


@main.command()
@click.argument("client_id")
@click.option("--out", "out_dir", default="keys", show_default=True,
              type=click.Path(file_okay=False), help="Directory for the key files.")
def keygen(client_id: str, out_dir: str) -> None:
    """Make an Ed25519 key pair for CLIENT_ID: CLIENT_ID.key (mode 0600) and .pub."""
    from .auth import keys
    from .names import check_label

    try:  # the broker registers no other ids: a key for one would never be accepted
        check_label("CLIENT_ID", client_id, MAX_CLIENT_ID, slash=False)
    except BadRequest as exc:
        fail(exc.message, code=2)
    key = keys.generate()
    try:
        private, public = keys.save(key, out_dir, client_id)
    except ConfigError as exc:
        fail("cannot write the key:", exc)
    click.echo(f"private key  {private}  (keep it secret: mode 0600)")
    click.echo(f"public key   {public}")
    click.echo(f"fingerprint  {keys.fingerprint(key)}")
    click.echo("the client signs short-lived tokens with the private key; the broker knows it by "
               "the public key")


@main.command()
@connection_options
@json_option
def cluster(conn: dict[str, Any], as_json: bool) -> None:
    """Show the brokers sharing this broker's storage (several on one Redis): the
    primary, the standbys (with the client connections each relays to the primary),
    the queues with their fencing epochs, recent takeovers. With placement = "spread":
    every broker, the queues with their owner and where placement puts them, and the
    recent adoptions and hand-overs."""
    view = _admin(conn, "cluster")
    if as_json:
        click.echo(json.dumps(view, indent=2))
        return
    console = out()
    if view.get("placement") == "spread":
        _show_spread(console, view)
        return
    brokers = Table(title=f"brokers on {view['storage']}"
                    + (f" (owner_lease {view['owner_lease']:g} s)" if view["owner_lease"] else ""))
    for col in ("broker", "role", "native", "http", "since", "relaying (now / in all)"):
        brokers.add_column(col)
    for b in view["brokers"]:
        since = b.get("since")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(since))) if since else ""
        relays = "" if b["role"] == "primary" else \
            f"{b.get('relaying', 0)} / {b.get('relayed', 0)}"
        brokers.add_row(b["id"] + (" (this one)" if b.get("self") else ""),
                        Text(b["role"], style="green" if b["role"] == "primary" else "yellow"),
                        str(b.get("native") or ""), str(b.get("http") or ""), when, relays)
    console.print(brokers)
    if view["queues"]:
        queues = Table(title="queues")
        for col in ("queue", "epoch", "owner"):
            queues.add_column(col)
        for q in view["queues"]:
            queues.add_row(q["queue"], str(q["epoch"]), str(q["owner"]))
        console.print(queues)
    if view["events"]:
        events = Table(title="recent takeovers")
        for col in ("when", "broker", "what"):
            events.add_column(col)
        for e in view["events"]:
            detail = f" (from {e['from']})" if e.get("from") else ""
            events.add_row(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["at"])),
                           e["by"], e["what"] + detail)
        console.print(events)
    me = view.get("this_broker") or {}
    if me:
        console.print(f"this broker: {me['role']}, {me['lease_renewals']} lease renewals, "
                      f"{me['takeovers']} takeovers, {me['fenced_writes']} fenced writes")


def _show_spread(console: Any, view: dict[str, Any]) -> None:
    """``minou cluster`` when the queues are spread over the brokers."""
    brokers = Table(title=f"brokers on {view['storage']} (queues spread, owner_lease "
                          f"{view['owner_lease']:g} s)")
    for col in ("broker", "alive", "native", "http", "since", "queues"):
        brokers.add_column(col)
    for b in view["brokers"]:
        since = b.get("since")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(since))) if since else ""
        brokers.add_row(b["id"] + (" (this one)" if b.get("self") else ""),
                        Text("yes" if b.get("alive") else "gone",
                             style="green" if b.get("alive") else "yellow"),
                        str(b.get("native") or ""), str(b.get("http") or ""), when,
                        str(len(b.get("queues") or [])))
    console.print(brokers)
    if view["queues"]:
        queues = Table(title="queues (owner: who serves it; placed: who rendezvous hashing "
                             "gives it to, it moves there)")
        for col in ("queue", "owner", "placed", "epoch here"):
            queues.add_column(col)
        for q in view["queues"]:
            moving = q["owner"] != q["placed"]
            queues.add_row(q["queue"], str(q["owner"] or "-"),
                           Text(str(q["placed"] or "-"), style="yellow" if moving else ""),
                           "" if q["epoch"] is None else str(q["epoch"]))
        console.print(queues)
    if view["events"]:
        events = Table(title="recent adoptions and hand-overs (this broker)")
        for col in ("when", "what", "queue", "detail"):
            events.add_column(col)
        for e in view["events"]:
            detail = f"to {e['to']}" if e.get("to") else \
                f"from {e['previous']}" if e.get("previous") else ""
            events.add_row(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["at"])),
                           e["what"], e["queue"], detail)
        console.print(events)
    me = view["this_broker"]
    console.print(f"this broker: {me['member']}, owns {me['queues_owned']} queue(s) of "
                  f"{me['alive']} live broker(s); {me['adopted']} adopted, "
                  f"{me['handed_over']} handed over, {me['fenced_writes']} fenced writes")


@main.command()
@connection_options
@json_option
def status(conn: dict[str, Any], as_json: bool) -> None:
    """Show the broker's identity, uptime, storage and counters."""
    st = _admin(conn, "status")
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    console = out()
    table = Table(show_header=False, title=f"minou {st['version']} — {st['broker_id']}")
    table.add_column("key", style="bold")
    table.add_column("value")
    table.add_row("uptime", f"{st['uptime_s']:.0f} s")
    table.add_row("native", str(st["native"]))
    table.add_row("http", str(st["http"]))
    table.add_row("storage", f"{st['storage']['backend']} {st['storage']['path']} "
                             f"({st['storage']['bytes'] / 1e6:.1f} MB)")
    table.add_row("connections", str(st["connections"]))
    if st.get("admission"):
        adm = st["admission"]
        table.add_row("sockets", f"native {adm['open']['native']}, http {adm['open']['http']} "
                                 f"of {adm['limit']} (file descriptors {adm['descriptors']}); "
                                 f"refused {json.dumps(adm['refused'])}")
    if st["storage"].get("full"):
        table.add_row("STORAGE FULL", Text(str(st["storage"]["full"]), style="red"))
    flow = st.get("flow") or {}
    if flow:
        table.add_row("slow consumers", f"{flow.get('slow_consumers_cut', 0)} cut; unsent "
                                        f"deliveries {flow.get('unsent_delivery_bytes', 0)} "
                                        f"bytes of {flow.get('delivery_buffer_budget', 0)}")
        table.add_row("dead connections", f"{flow.get('dead_connections_cut', 0)} cut (no "
                                          "heartbeat for two intervals)")
        if "in_flight_bytes" in flow:
            table.add_row("unsettled", f"{flow['in_flight_bytes']} bytes of messages delivered "
                                       f"and not settled, of {flow['in_flight_limit']}")
    auth = st["auth"]
    table.add_row("auth", f"{auth['mode']}: {auth['clients']} clients, {auth['pending']} pending, "
                          f"{auth['rules']} rules; failures {json.dumps(auth['failures'])}")
    if st["tls"]:
        table.add_row("tls", st["tls"]["fingerprint"])
    if st["schemas"]["declared"]:
        table.add_row("schemas", f"{', '.join(st['schemas']['declared'])}; refused "
                                 f"{json.dumps(st['schemas']['refused'])}")
    table.add_row("channels / groups", f"{st['channels']} / {st['groups']}")
    for key, value in st["counters"].items():
        table.add_row(key, json.dumps(value) if isinstance(value, dict) else str(value))
    console.print(table)


@main.group()
def clients() -> None:
    """Registered client keys: list, approve, revoke, rotate, forget (admin only)."""


page_option = click.option(
    "--limit", type=click.IntRange(1, MAX_ADMIN_PAGE), default=DEFAULT_ADMIN_PAGE,
    show_default=True, help="Asked for per page (every page is printed).")


@clients.command(name="list")
@connection_options
@json_option
@page_option
def clients_list(conn: dict[str, Any], as_json: bool, limit: int) -> None:
    """Registered and pending clients with their key fingerprints and rights."""
    pages = _admin_pages(conn, "clients.list", limit)
    if as_json:
        click.echo(json.dumps(_joined(pages, "clients"), indent=2))
        return
    console = out()
    first: dict[str, Any] = {}
    for data in pages:  # printed as they come: 200,000 clients are not held at once
        _print_clients(console, data["clients"], title="" if first else "clients")
        first = first or data
    if first.get("reservations"):
        res = Table(title="reserved channels (!)")
        res.add_column("channel")
        res.add_column("owner")
        for channel, owner in first["reservations"].items():
            res.add_row(channel, owner)
        console.print(res)


def _print_clients(console: Any, clients: list[dict[str, Any]], title: str) -> None:
    table = Table(title=title or None)
    for col in ("client", "status", "admin", "online", "last seen", "note"):
        table.add_column(col)
    for c in clients:
        style = {"pending": "yellow", "revoked": "red"}.get(c["status"], "")
        seen = (f"{max(0.0, _now() - c['last_seen']):.0f} s ago" if c["last_seen"] else "-")
        admin = "yes" if c["admin"] else \
            Text("waits for approval", style="yellow") if c.get("admin_pending") else ""
        table.add_row(c["client_id"], Text(c["status"], style=style), admin,
                      str(c["connections"]), seen, c["note"])
    console.print(table)
    # Fingerprints are compared whole, so each gets a line of its own rather than a
    # table cell that a narrow terminal would fold or cut.
    for c in clients:
        console.print(f"{c['fingerprint']}  {c['client_id']}", soft_wrap=True)


def _admin_pages(conn: dict[str, Any], op: str, limit: int, **args: Any
                 ) -> Iterator[dict[str, Any]]:
    """Every page of a paged admin listing (core/paging.py), over one connection, each
    as it comes; a refusal is printed, not a traceback."""
    from .errors import NotFound, RequestError

    with _client(conn) as client:
        after = ""
        while True:
            try:
                page = client.admin(op, **args, limit=limit, after=after)
            except NotFound as exc:
                fail("not found:", exc)
            except RequestError as exc:
                fail("refused:", exc)
            yield page
            # A broker without paging answers everything once, with no "more".
            if not page.get("more") or page.get("next") in (None, after):
                return
            after = page["next"]


def _joined(pages: Iterable[dict[str, Any]], key: str) -> dict[str, Any]:
    """The pages of a listing as one answer: the first page's fields, every item."""
    whole: dict[str, Any] = {}
    items: list[Any] = []
    for page in pages:
        whole = whole or dict(page)
        items += page[key]
    whole.update({key: items, "more": False, "next": None})
    return whole


def _now() -> float:
    import time

    return time.time()


def _client_command(op: str, verb: str) -> Callable[..., Any]:
    @connection_options
    @click.argument("target", metavar="CHANNEL" if op == "reservations.release" else "CLIENT_ID")
    @json_option
    def command(conn: dict[str, Any], target: str, as_json: bool) -> None:
        field = "channel" if op == "reservations.release" else "client_id"
        result = _admin(conn, op, **{field: target})
        if as_json:
            click.echo(json.dumps(result, indent=2))
        elif op == "reservations.release":
            click.echo(f"released {result['channel']} (was {result['released_from']}'s)")
        else:
            closed = result.get("connections_closed")
            tail = f"; {closed} connection(s) closed" if closed else ""
            if result.get("admin"):
                tail += "; admin"
            click.echo(f"{verb} {result['client_id']} ({result['fingerprint']}): "
                       f"{result['status']}{tail}")

    return command


clients.command(name="approve", help="Approve a pending (or revoked) client; for an id listed "
                                     "in auth.admins, also approve its key as an admin's (the "
                                     "only way a registered key gains admin rights).")(
    _client_command("clients.approve", "approved"))
clients.command(name="revoke", help="Revoke a client: its connections close, its key stops "
                                    "working.")(_client_command("clients.revoke", "revoked"))
clients.command(name="forget", help="Remove a client's record (reject a pending one; the id may "
                                    "register afresh).")(
    _client_command("clients.forget", "forgot"))
clients.command(name="release", help="Release a reserved (!) channel for its next reader.")(
    _client_command("reservations.release", "released"))


@clients.command(name="rotate")
@connection_options
# Not "client_id": that is the --client-id option's parameter (who runs the command).
@click.argument("target", metavar="CLIENT_ID")
@click.argument("public_key", metavar="PUBFILE", type=click.Path(exists=True, dir_okay=False))
@json_option
def clients_rotate(conn: dict[str, Any], target: str, public_key: str, as_json: bool) -> None:
    """Give CLIENT_ID a new key (PUBFILE: its .pub file from minou keygen); its
    connections close and only the new key works from now on."""
    pem = Path(public_key).read_text(encoding="utf-8")
    result = _admin(conn, "clients.rotate", client_id=target, public_key=pem)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(f"rotated {target}: now {result['fingerprint']}")


@main.group()
def credentials() -> None:
    """Delegated credentials: secrets that act as a client, under its rules and without
    admin rights, for work that must not hold its key (Spark executors). A client
    issues, renews and revokes its own; an admin lists and revokes anyone's."""


@credentials.command(name="issue")
@connection_options
@click.option("--ttl", type=FiniteRange(1, 7 * 86400), default=3600.0,
              show_default=True, help="Seconds it lives (renew to extend).")
@click.option("--purpose", default="", help="Shown in listings and logs.")
@json_option
def credentials_issue(conn: dict[str, Any], ttl: float, purpose: str, as_json: bool) -> None:
    """Issue a credential for the client running this command (with its key). The
    secret is printed once, on stdout: pass it to the work as `credential=`."""
    result = _admin(conn, "credentials.issue", ttl=ttl, purpose=purpose)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(result["credential"])
    say("issued", f"credential {result['id']} for {result['client_id']}, expires in "
                  f"{result['expires_at'] - _now():.0f} s", style="green")


@credentials.command(name="list")
@connection_options
@json_option
@page_option
def credentials_list(conn: dict[str, Any], as_json: bool, limit: int) -> None:
    """Live credentials (yours; an admin's: everyone's), never their secrets."""
    pages = _admin_pages(conn, "credentials.list", limit)
    if as_json:
        click.echo(json.dumps(_joined(pages, "credentials"), indent=2))
        return
    for n, data in enumerate(pages):  # printed as they come
        table = Table(title=None if n else "credentials")
        for col in ("id", "client", "expires in", "renewed", "purpose"):
            table.add_column(col)
        for c in data["credentials"]:
            renewed = f"{_now() - c['renewed_at']:.0f} s ago" if c["renewed_at"] else "-"
            table.add_row(c["id"], c["client_id"], f"{c['expires_at'] - _now():.0f} s",
                          renewed, c["purpose"])
        out().print(table)


@credentials.command(name="renew")
@connection_options
@click.argument("credential_id", metavar="ID")
@click.option("--ttl", type=FiniteRange(1, 7 * 86400), default=3600.0,
              show_default=True, help="Seconds from now.")
@json_option
def credentials_renew(conn: dict[str, Any], credential_id: str, ttl: float,
                      as_json: bool) -> None:
    """Extend a live credential to now + TTL (never shorter: one that already lasts
    longer keeps its expiry)."""
    result = _admin(conn, "credentials.renew", id=credential_id, ttl=ttl)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(f"renewed {credential_id}: expires in {result['expires_at'] - _now():.0f} s")


@credentials.command(name="revoke")
@connection_options
@click.argument("credential_id", metavar="ID")
@json_option
def credentials_revoke(conn: dict[str, Any], credential_id: str, as_json: bool) -> None:
    """Void a credential now; connections that presented it close."""
    result = _admin(conn, "credentials.revoke", id=credential_id)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(f"revoked {credential_id} of {result['client_id']}; "
                   f"{result['connections_closed']} connection(s) closed")


@main.group()
def writers() -> None:
    """Writer ids of exactly-once commits (Spark's writerId), each owned by the client that
    first committed under it (admin only)."""


@writers.command(name="release")
@connection_options
@click.argument("writer_id")
@click.option("--drop-fences", is_flag=True,
              help="Also forget its fences (after a squatter moved them); without this the "
                   "next owner keeps the job's progress.")
@json_option
def writers_release(conn: dict[str, Any], writer_id: str, drop_fences: bool,
                    as_json: bool) -> None:
    """Free WRITER_ID for the next client that commits under it (e.g. a job that moved to
    another client id)."""
    result = _admin(conn, "writers.release", writer_id=writer_id, drop_fences=drop_fences)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        was = result["released_from"]
        click.echo(f"released writer id {writer_id}" + (f" (was {was}'s)" if was else "")
                   + ("; its fences were dropped" if result["fences_dropped"] else ""))


@main.command()
@connection_options
@json_option
def reload(conn: dict[str, Any], as_json: bool) -> None:
    """Re-read the broker's config file: rules, schemas, limits and channel options apply at
    once, without dropping connections. A config that does not validate changes nothing."""
    result = _admin(conn, "reload")
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    changed = ", ".join(result["changed"]) or "nothing"
    click.echo(f"reloaded {result['reloaded']}: changed {changed}")
    if result["needs_restart"]:
        click.echo(f"not applied (needs a restart): {', '.join(result['needs_restart'])}")
    for sub in result["subscriptions_closed"]:
        click.echo(f"ended subscription {sub['sid']} of {sub['client_id']}: {sub['reason']}")
    for line in result["schemas"]:
        click.echo(f"schema {line}")


@main.command()
@connection_options
@json_option
def whoami(conn: dict[str, Any], as_json: bool) -> None:
    """Who the broker thinks you are, and what you may read and write."""
    with _client(conn) as client:
        me = client.admin("whoami")
    if as_json:
        click.echo(json.dumps(me, indent=2))
        return
    click.echo(f"{me['client_id']} ({me['method']}{', admin' if me['admin'] else ''}) "
               f"{me['fingerprint']}")
    if me["access"]:
        click.echo(f"read:  {', '.join(me['access']['read']) or '-'}")
        click.echo(f"write: {', '.join(me['access']['write']) or '-'}")


main.add_command(kv_group(connection_options, json_option, _client, fail, _json_payload))


@main.command()
@connection_options
@json_option
def federation(conn: dict[str, Any], as_json: bool) -> None:
    """The broker's federation links ([[federation]]): each direction's state, last
    error, messages carried and lag (admin)."""
    view = _admin(conn, "federation")
    if as_json:
        click.echo(json.dumps(view, indent=2))
        return
    if not view["links"]:
        click.echo("no federation link ([[federation]] in the config)")
    for link in view["links"]:
        click.echo(f"{link['name']} -> {link['remote']}"
                   + (f" (prefix {link['prefix']!r})" if link["prefix"] else ""))
        for p in link["pipes"]:
            since = time.strftime("%H:%M:%S", time.localtime(p["since"]))
            click.echo(f"  {p['direction']:<4} {', '.join(p['patterns'])}: {p['state']} since "
                       f"{since}, {p['forwarded']} carried ({p['rate']:.0f} msg/s), lag "
                       f"{_lag_messages(p)} / "
                       f"{p['lag_seconds']:.1f} s"
                       + (f", {p['skipped_loops']} loop(s) skipped" if p["skipped_loops"]
                          else "")
                       + (f", {p['dead_lettered']} dead-lettered" if p["dead_lettered"]
                          else "")
                       + (f", {p['refused_channels']} channel(s) refused there"
                          if p.get("refused_channels") else "")
                       + (f", {p['foreign_channels']} channel(s) outside its patterns "
                          "named by the source" if p.get("foreign_channels") else "")
                       + (f", {p['orphans_dropped']} staged page(s) aborted"
                          if p.get("orphans_dropped") else ""))
            if p["last_error"]:
                click.echo(f"       last error: {p['last_error']}")


def _lag_messages(pipe: dict[str, Any]) -> str:
    """A direction's lag in messages, said to be the last figure known when its source
    (a pull's remote) is out of reach."""
    if not pipe.get("lag_last_known"):
        return f"{pipe['lag_messages']} msg"
    counted = pipe.get("lag_counted_at")
    if counted is None:
        return "? msg (the remote not reached yet)"
    at = time.strftime("%H:%M:%S", time.localtime(counted))
    return f"{pipe['lag_messages']} msg (last known, at {at})"


if __name__ == "__main__":
    main()
