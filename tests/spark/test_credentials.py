"""The executors' credential, on local[2] (the cluster tests prove the key never leaves
the driver's machine; these cover issue, use, renewal, revocation and the options)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from pyspark.sql import functions as F

import minou
from minou.auth import keys as keyfiles
from minou.auth.tokens import make_token

from ..conftest import BrokerProcess, wait_until
from .conftest import client_options
from .helpers import payloads, publish, unique


def authentications(broker: BrokerProcess, method: str) -> float:
    """minou_authentications_total{method=...}: connections authenticated that way."""
    key = keyfiles.load_private(broker.admin_key)
    headers = {"Authorization": f"Bearer {make_token('admin', key, 'minou', ttl=60)}"}
    text = httpx.get(broker.http + "/metrics", headers=headers, timeout=5).text
    for line in text.splitlines():
        if line.startswith(f'minou_authentications_total{{method="{method}"}}'):
            return float(line.split()[-1])
    return 0.0


def credentials_of(admin: Any, client_id: str) -> list[dict[str, Any]]:
    return [c for c in admin.admin("credentials.list")["credentials"]
            if c["client_id"] == client_id]


def test_tasks_connect_with_a_credential_the_driver_issued(spark: Any, minou_broker: Any,
                                                           admin: Any) -> None:
    ep = unique("cred")
    client_id = f"spark-{ep}"
    opts = client_options(minou_broker, client_id)
    with minou_broker.connect_sync(client_id) as c:
        publish(c, f"{ep}/v1/a", 120)
    before = authentications(minou_broker, "credential")
    df = (spark.read.format("minou").options(**opts).option("pattern", f"{ep}/v1/*")
          .option("maxRecordsPerPartition", "40").load())
    assert df.count() == 120
    # three partitions, each a task with its own connection, none of them with the key
    assert authentications(minou_broker, "credential") - before >= 3
    [issued] = credentials_of(admin, client_id)
    assert issued["purpose"].startswith(f"spark read {ep}/v1/*")
    assert 3500 < issued["expires_at"] - time.time() <= 3600  # batch default: an hour
    again_df = (spark.read.format("minou").options(**opts).option("pattern", f"{ep}/v1/*")
                .option("maxRecordsPerPartition", "40").load())
    assert again_df.count() == 120  # the same read again reuses (and renews) the credential
    [again] = credentials_of(admin, client_id)
    assert again["id"] == issued["id"] and again["renewed_at"]


def test_a_batch_write_revokes_its_credential_when_done(spark: Any, minou_broker: Any,
                                                        admin: Any) -> None:
    ep = unique("credw")
    client_id = f"spark-{ep}"
    opts = client_options(minou_broker, client_id)
    before = authentications(minou_broker, "credential")
    (spark.range(50).select(F.to_json(F.struct("id")).alias("payload")).write
     .format("minou").options(**opts).option("channel", f"{ep}/v1/x")
     .option("writerId", f"w-{ep}").mode("append").save())
    assert authentications(minou_broker, "credential") > before
    assert credentials_of(admin, client_id) == []  # revoked at commit, not left to expire
    with minou_broker.connect_sync(client_id) as c:
        assert len(payloads(c, f"{ep}/v1/x")) == 50


def test_executor_auth_keyfile_issues_nothing(spark: Any, minou_broker: Any,
                                              admin: Any) -> None:
    ep = unique("credk")
    client_id = f"spark-{ep}"
    opts = {**client_options(minou_broker, client_id), "executorAuth": "keyFile"}
    with minou_broker.connect_sync(client_id) as c:
        publish(c, f"{ep}/v1/a", 10)
    before = authentications(minou_broker, "credential")
    assert spark.read.format("minou").options(**opts).option(
        "pattern", f"{ep}/v1/*").load().count() == 10
    assert authentications(minou_broker, "credential") == before
    assert credentials_of(admin, client_id) == []


@pytest.mark.parametrize(("option", "value", "message"), [
    ("executorAuth", "ssh", "expected credential"),
    ("credentialTtl", "0.5", "must be 1..604800"),
    ("credentialTtl", "1e9", "must be 1..604800"),
])
def test_bad_credential_options_fail_the_plan(spark: Any, opts: dict[str, str], option: str,
                                              value: str, message: str) -> None:
    with pytest.raises(Exception, match=message):
        spark.read.format("minou").options(**opts).option(option, value).option(
            "pattern", "x/v1/*").load().count()


def _stream(spark: Any, opts: dict[str, str], ep: str, cp: Path, ttl: str) -> Any:
    src = (spark.readStream.format("minou").options(**opts).option("credentialTtl", ttl)
           .option("pattern", f"{ep}/v1/*").load())
    out = src.select(F.to_json(F.struct("channel", "seq")).alias("payload"))
    return (out.writeStream.format("minou").options(**opts).option("credentialTtl", ttl)
            .option("channel", f"{ep}out/v1/x").option("writerId", f"w-{ep}")
            .option("checkpointLocation", str(cp)).trigger(processingTime="300 milliseconds")
            .start())


def test_a_stream_outlives_its_credentials_ttl_by_renewing(spark: Any, minou_broker: Any,
                                                           admin: Any, tmp_path: Path) -> None:
    """credentialTtl=8 s, the query runs 3 times as long: every task's connection still
    authenticates, because the driver renews at each trigger and each commit. (Shorter
    than the few seconds a stream takes to start, a credential would expire before the
    first trigger renews it: a real one lives hours.)"""
    ep = unique("renew")
    client_id = f"spark-{ep}"
    opts = client_options(minou_broker, client_id)
    query = _stream(spark, opts, ep, tmp_path / "cp", "8")
    try:
        with minou_broker.connect_sync(client_id) as c:
            started = time.monotonic()
            sent = 0
            while time.monotonic() - started < 24:
                publish(c, f"{ep}/v1/a", 20, start=sent)
                sent += 20
                time.sleep(1.0)
            try:
                wait_until(lambda: len(payloads(c, f"{ep}out/v1/x")) >= sent, timeout=60,
                           what="every row through the stream")
            except AssertionError:
                raise AssertionError(f"{len(payloads(c, f'{ep}out/v1/x'))} of {sent}; "
                                     f"{query.exception()}; {query.lastProgress}; "
                                     f"{credentials_of(admin, client_id)}") from None
            assert query.exception() is None
            keys = Counter((p["channel"], p["seq"]) for p in payloads(c, f"{ep}out/v1/x"))
            assert len(keys) == sent and max(keys.values()) == 1
        live = credentials_of(admin, client_id)
        # one for the source and one for the sink, whatever the number of batches (the
        # sink's writer is pickled for every micro-batch: each reuses the first)
        assert sorted(c["purpose"].split()[1] for c in live) == ["read", "write"], live
        assert all(c["renewed_at"] for c in live)
        assert all(c["expires_at"] > c["issued_at"] + 4 for c in live)  # moved on
    finally:
        query.stop()


def test_revoking_the_client_fails_the_query_with_a_precise_error(
        spark: Any, minou_broker: Any, admin: Any, tmp_path: Path) -> None:
    ep = unique("revoke")
    client_id = f"spark-{ep}"
    opts = client_options(minou_broker, client_id)
    with minou_broker.connect_sync(client_id) as c:
        publish(c, f"{ep}/v1/a", 10)
    query = _stream(spark, opts, ep, tmp_path / "cp", "60")
    try:
        wait_until(lambda: any(p["numInputRows"] for p in query.recentProgress), timeout=60,
                   what="a first batch")
        admin.admin("clients.revoke", client_id=client_id)
        assert not _terminates_cleanly(query)
        assert f"client '{client_id}' is revoked" in str(query.exception())
        assert credentials_of(admin, client_id) == []
    finally:
        query.stop()
        admin.admin("clients.approve", client_id=client_id)
    with pytest.raises(minou.NotAuthenticated, match="unknown"):
        minou.connect_sync(minou_broker.url, client_id=client_id, credential="mdc1.a.b",
                           reconnect=False).close()


def _terminates_cleanly(query: Any) -> bool:
    try:
        query.awaitTermination(60)
    except Exception:  # the StreamingQueryException: what the test reads next
        return False
    return query.exception() is None
