"""``minou kv``: key-value buckets from the shell (docs/kv.md).

The commands are built by ``kv_group`` from the main CLI's connection helpers (passed
in, so this module does not import ``cli``, which registers the group).
"""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Callable
from typing import Any

import click

from .errors import MinouError, NotFound, RevisionMismatch, Timeout
from .limits import DEFAULT_ADMIN_PAGE, MAX_ADMIN_PAGE, MAX_KV_REVISION


class FiniteRange(click.FloatRange):
    """``click.FloatRange`` without NaN and the infinities: its bounds are comparisons,
    which NaN passes, so ``--timeout nan`` reached the client and ended in a
    traceback."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{number} is not a finite number.", param, ctx)
        return number


# A revision given on the command line: past MAX_KV_REVISION (an integer past 64 bits),
# the broker refuses it, or the client cannot send it.
def _revision(lowest: int) -> click.IntRange:
    return click.IntRange(min=lowest, max=MAX_KV_REVISION)


def _shown(value: Any) -> str:
    if isinstance(value, bytes):
        return f"<{len(value)} raw bytes>"
    return json.dumps(value)


def _buckets(client: Any, limit: int, each: Callable[[dict[str, Any]], None] | None
             ) -> list[dict[str, Any]]:
    """Every bucket, a page (kv.buckets) at a time: handed to ``each`` as they come
    (then not kept), else returned together."""
    found: list[dict[str, Any]] = []
    after = ""
    while True:
        page = client.admin("kv.buckets", limit=limit, after=after)
        for b in page["buckets"]:
            if each is None:
                found.append(b)
            else:
                each(b)
                found[:1] = [b]  # "any at all", for the empty listing's line
        if not page.get("more") or page.get("next") in (None, after):
            return found  # (a broker without pages answers every bucket, no "more")
        after = page["next"]


def _print_bucket(b: dict[str, Any]) -> None:
    ttl = f"ttl {b['ttl']:g} s" if b["ttl"] else "no ttl"
    click.echo(f"{b['bucket']}: {b['keys']} key(s), {b['revisions']} revision(s) held, "
               f"history {b['history']}, {ttl}")


def _entry_json(entry: Any) -> dict[str, Any]:
    value = entry.value
    out = {"key": entry.key, "revision": entry.revision, "op": entry.op,
           "created": entry.created, "expires_at": entry.expires_at}
    if isinstance(value, bytes):
        out["value_base64"] = base64.b64encode(value).decode()
    else:
        out["value"] = value
    return out


def kv_group(connection_options: Callable[..., Any], json_option: Callable[..., Any],
             connect: Callable[[dict[str, Any]], Any],
             fail: Callable[..., Any], read_json: Callable[[str], Any]) -> click.Group:
    """The ``kv`` command group; ``connect(conn)`` opens a SyncClient (exiting on a
    refusal), ``fail(label, detail, code)`` exits, ``read_json`` parses a VALUE
    argument ('-' stdin, '@FILE')."""

    @click.group(name="kv")
    def kv() -> None:
        """Key-value buckets: values by key, each write a new revision.

        A bucket is made by its first put. Rules name bucket B as kv/B; its options
        (history, ttl) come from [kv."B"] in the broker's config."""

    def run(conn: dict[str, Any], call: Callable[[Any], Any]) -> Any:
        with connect(conn) as client:
            try:
                return call(client)
            except RevisionMismatch as exc:
                fail("revision mismatch:", exc, 1)
            except NotFound as exc:
                fail("not found:", exc, 1)
            except MinouError as exc:
                fail("refused:", exc, 1)

    @kv.command()
    @connection_options
    @click.argument("bucket")
    @click.argument("name", metavar="KEY")
    @click.option("--revision", "-r", type=_revision(1), help="A stored revision.")
    @json_option
    def get(conn: dict[str, Any], bucket: str, name: str, revision: int | None,
            as_json: bool) -> None:
        """Print KEY's value in BUCKET (exit 1 when it has none)."""
        entry = run(conn, lambda c: c.kv(bucket).get(name, revision=revision))
        if entry is None:
            fail("not found:", f"key {name!r} has no value in bucket {bucket!r}", 1)
        if as_json:
            click.echo(json.dumps(_entry_json(entry)))
        elif entry.deleted:
            click.echo(f"(deleted at revision {entry.revision})")
        else:
            click.echo(_shown(entry.value) if isinstance(entry.value, bytes)
                       else json.dumps(entry.value, indent=2))

    @kv.command()
    @connection_options
    @click.argument("bucket")
    @click.argument("name", metavar="KEY")
    @click.argument("value")
    @click.option("--revision", "-r", type=_revision(0),
                  help="Compare-and-set: only if KEY is at this revision (0: has no value).")
    @click.option("--create", is_flag=True, help="Only if KEY has no value (--revision 0).")
    @click.option("--ttl", type=FiniteRange(min=0, min_open=True),
                  help="Seconds the value lives (default: the bucket's ttl).")
    @json_option
    def put(conn: dict[str, Any], bucket: str, name: str, value: str, revision: int | None,
            create: bool, ttl: float | None, as_json: bool) -> None:
        """Store VALUE (JSON text; '-' reads stdin, @FILE a file) under KEY."""
        if create and revision not in (None, 0):
            fail("--create and --revision:", "give one of them", 2)
        parsed = read_json(value)
        expect = 0 if create else revision
        rev = run(conn, lambda c: c.kv(bucket).put(name, parsed, revision=expect, ttl=ttl))
        click.echo(json.dumps({"bucket": bucket, "key": name, "revision": rev}) if as_json
                   else f"stored {bucket}/{name} revision {rev}")

    @kv.command(name="del")
    @connection_options
    @click.argument("bucket")
    @click.argument("name", metavar="KEY")
    @click.option("--revision", "-r", type=_revision(0),
                  help="Only if KEY is at this revision.")
    @json_option
    def delete(conn: dict[str, Any], bucket: str, name: str, revision: int | None,
               as_json: bool) -> None:
        """Delete KEY (its history keeps the delete)."""
        rev = run(conn, lambda c: c.kv(bucket).delete(name, revision=revision))
        click.echo(json.dumps({"bucket": bucket, "key": name, "revision": rev}) if as_json
                   else f"deleted {bucket}/{name} (revision {rev})")

    @kv.command(name="ls")
    @connection_options
    @click.argument("bucket", required=False)
    @click.option("--prefix", "-p", default="", help="Only keys starting with this.")
    @click.option("--values", "-v", is_flag=True, help="Show each key's value and revision.")
    @click.option("--limit", type=click.IntRange(1, MAX_ADMIN_PAGE), default=DEFAULT_ADMIN_PAGE,
                  show_default=True,
                  help="Buckets asked for per page (every page is printed).")
    @json_option
    def ls(conn: dict[str, Any], bucket: str | None, prefix: str, values: bool, limit: int,
           as_json: bool) -> None:
        """List the buckets you may read, or BUCKET's keys."""
        if bucket is None:
            found = run(conn, lambda c: _buckets(c, limit, None if as_json else _print_bucket))
            if as_json:
                click.echo(json.dumps(found))
            elif not found:
                click.echo("no bucket yet (the first put makes one)")
            return
        if values:
            items = run(conn, lambda c: c.kv(bucket).items(prefix))
            if as_json:
                click.echo(json.dumps([_entry_json(e) for e in items.values()]))
                return
            for key in sorted(items):
                e = items[key]
                click.echo(f"{key}  rev={e.revision}  {_shown(e.value)}")
            return
        keys = run(conn, lambda c: c.kv(bucket).keys(prefix))
        click.echo(json.dumps(keys) if as_json else "\n".join(keys))

    @kv.command()
    @connection_options
    @click.argument("bucket")
    @click.argument("name", metavar="KEY")
    @json_option
    def history(conn: dict[str, Any], bucket: str, name: str, as_json: bool) -> None:
        """Every stored revision of KEY, oldest first."""
        entries = run(conn, lambda c: c.kv(bucket).history(name))
        if not entries:
            fail("not found:", f"key {name!r} has no revision in bucket {bucket!r}", 1)
        for e in entries:
            click.echo(json.dumps(_entry_json(e)) if as_json else
                       f"rev={e.revision} {e.op} {'' if e.deleted else _shown(e.value)}")

    @kv.command()
    @connection_options
    @click.argument("bucket")
    @click.option("--prefix", "-p", default="", help="Only keys starting with this.")
    @click.option("--no-initial", is_flag=True, help="Only changes, not the current values.")
    @click.option("--count", "-n", type=click.IntRange(min=0), default=0,
                  help="Stop after N entries (0 = no limit).")
    @click.option("--timeout", "-t", type=FiniteRange(min=0), default=0.0,
                  help="Stop when nothing changes for this many seconds (0 = until Ctrl-C).")
    @json_option
    def watch(conn: dict[str, Any], bucket: str, prefix: str, no_initial: bool, count: int,
              timeout: float, as_json: bool) -> None:
        """Print BUCKET's current values, then every change as it is committed."""
        with connect(conn) as client:
            try:  # a bad bucket name is refused here, before any poll
                watching = client._client.kv(bucket).watch(prefix, initial=not no_initial)
            except MinouError as exc:
                fail("refused:", exc, 1)
            runner = client._runner
            seen = 0
            try:
                while not count or seen < count:
                    try:
                        entry = runner.call(_next(watching, timeout))
                    except (TimeoutError, Timeout):
                        break
                    except StopAsyncIteration:
                        break
                    except MinouError as exc:
                        fail("refused:", exc, 1)
                    seen += 1
                    if as_json:
                        click.echo(json.dumps(_entry_json(entry)))
                    else:
                        stamp = time.strftime("%H:%M:%S", time.localtime(entry.created))
                        shown = "" if entry.deleted else " " + _shown(entry.value)
                        click.echo(f"{stamp} {entry.op} {entry.key} rev={entry.revision}"
                                   f"{shown}")
            except KeyboardInterrupt:
                pass

    return kv


async def _next(watching: Any, timeout: float) -> Any:
    import asyncio

    if not timeout:
        return await anext(watching)
    return await asyncio.wait_for(anext(watching), timeout)
