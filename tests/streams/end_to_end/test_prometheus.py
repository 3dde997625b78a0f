"""The operator's view against a real Prometheus scraping a real worker.

A Prometheus server (Debian's ``prometheus`` package; ``.ci/run`` installs it when missing) is
started on a free loopback port with the deployment's alert rules, scraping one worker every
second. The test drives purchases, values and bad events, then evaluates **every PromQL
expression of the Grafana dashboard and of the alert rules** through Prometheus's HTTP API:
each must return data, and the figures must agree with what the test did.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from streams.broker.embedded import find_free_port
from streams.clients.client import MarketClient, now_ms
from streams.wire.events import LinearLevelSpec, PurchaseFulfilled, Rejection

from .. import helpers
from ..conftest import Market

ROOT = Path(__file__).resolve().parents[3]
PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="prometheus not installed: apt-get install prometheus (.ci/run does)",
    ),
]


class Prometheus:
    """A Prometheus server of our own on 127.0.0.1, stopped by its PID."""

    def __init__(self, tmp: Path, targets: list[str]) -> None:
        rules = tmp / "alerts.yml"
        shutil.copy(ROOT / "deploy/prometheus/alerts.yml", rules)
        config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [str(rules)]
        # the deployment's job, so `up{job=...}` matches; no Kafka nor Alertmanager here
        (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "epsilon-market"]
        job["static_configs"] = [{"targets": targets}]
        config["scrape_configs"] = [job]
        del config["alerting"]
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = find_free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        assert PROMETHEUS is not None
        self.log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def value(self, expr: str) -> float:
        (sample,) = self.query(expr)
        return float(sample["value"][1])

    def wait(self, what: str, ok: Any, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = ok()
                if last:
                    return
            except (OSError, ValueError, AssertionError) as exc:  # not up yet, no sample yet
                last = exc
            time.sleep(0.5)
        raise TimeoutError(f"{what}: {last!r}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def prometheus(market: Market, tmp_path: Path) -> Iterator[tuple[Prometheus, Any]]:
    w = market.start_worker()
    prom = Prometheus(tmp_path, [w.url.removeprefix("http://")])
    try:
        prom.wait("the worker is scraped", lambda: prom.value('up{job="epsilon-market"}') == 1)
        yield prom, w
    finally:
        prom.stop()


def dashboard_exprs() -> list[str]:
    dash = json.loads((ROOT / "deploy/grafana/dashboards/epsilon-market.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def alert_rules() -> list[dict[str, Any]]:
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    return [r for g in rules["groups"] for r in g["rules"]]


_THRESHOLD = re.compile(r"\s*(==|!=|>=|<=|>|<)\s*[0-9.e+-]+\s*$")


def measured(expr: str) -> list[str]:
    """What an alert compares, without the comparison: ``a > 5 and b > 1`` → ``[a, b]``.

    A healthy market makes the alert's condition false, so the rule itself returns nothing;
    what must return data is each quantity it compares (else the alert could never fire).
    """
    return [_THRESHOLD.sub("", part).strip() for part in re.split(r"\s+and\s+", expr.strip())]


def drive(market: Market) -> dict[str, Any]:
    """Purchases, values and bad events a test can count: what Prometheus must then show."""
    market.open_accounts("seller1", "alice", "bob")
    m = market.topics.prefix

    async def go(c: MarketClient) -> dict[str, Any]:
        for sid, mech, cap in (("temp", "laplace", 4.0), ("load", "gaussian", 4.0)):
            entry = await c.register(
                {
                    "stream_id": sid,
                    "mechanism": mech,
                    "sensitivity": 1.0,
                    "dimension": 2,
                    "steps": [0.5, 1.0, 2.0],
                    "cap": cap,
                    "retain_last": 4,
                    "pricing": LinearLevelSpec(rate_per_level=100.0),
                }
            )
            assert not isinstance(entry, Rejection), entry
            for i in range(3):
                await c.publish(sid, [1.0 + i, 2.0], value_id=f"{sid}{i}")
        paid, fulfilled = 0, 0
        for buyer, sid, target in (
            ("alice", "temp", None),
            ("alice", "temp", 4.0),
            ("bob", "load", None),
        ):
            out = await helpers.buy(c, buyer, sid, max_price_minor=10_000, target_level=target)
            assert isinstance(out, PurchaseFulfilled), out
            paid, fulfilled = paid + out.price_minor, fulfilled + 1
        # a 'window' stream whose window fills: its third value is withheld from bob
        entry = await c.register(
            {
                "stream_id": "home",
                "mechanism": "laplace",
                "sensitivity": 1.0,
                "dimension": 2,
                "steps": [0.5, 1.0],
                "cap": 1.0,
                "retain_last": 4,
                "privacy_unit": "window",
                "window": {"duration_ms": 600_000, "cap": 1.0},
                "pricing": LinearLevelSpec(rate_per_level=100.0),
            }
        )
        assert not isinstance(entry, Rejection), entry
        out = await helpers.buy(c, "bob", "home", max_price_minor=10_000)
        assert isinstance(out, PurchaseFulfilled), out
        paid, fulfilled = paid + out.price_minor, fulfilled + 1
        base = now_ms() // 600_000 * 600_000  # one window for all three, whenever this runs
        for i in range(3):
            await c.publish("home", [1.0, 2.0], value_id=f"home{i}", published_at_ms=base + i)
        refused = await helpers.buy(c, "bob", "load", max_price_minor=1, target_level=4.0)
        assert isinstance(refused, Rejection) and refused.reason == "price_too_high"
        # a stream where one buyer may hold half its cap: alice asks for all of it
        entry = await c.register(
            {
                "stream_id": "shared",
                "mechanism": "laplace",
                "sensitivity": 1.0,
                "dimension": 2,
                "steps": [0.5, 1.0],
                "cap": 1.0,
                "buyer_share": 0.5,
                "pricing": LinearLevelSpec(rate_per_level=100.0),
            }
        )
        assert not isinstance(entry, Rejection), entry
        over = await helpers.buy(c, "alice", "shared", max_price_minor=10_000, target_level=1.0)
        assert isinstance(over, Rejection) and over.reason == "buyer_quota_exceeded"
        # a value of the wrong size, and a purchase bob signs as alice
        await c.send(
            c.topics.values,
            "temp",
            helpers.value("temp", "bad", [1.0, 2.0, 3.0], market=m, published_at_ms=now_ms()),
        )
        forged = helpers.purchase(
            "temp", "alice", "forged", market=m, signer="bob", requested_at_ms=now_ms()
        )
        await c.send(c.topics.purchases, "temp", forged)
        return {"paid": paid, "fulfilled": fulfilled}

    done: dict[str, Any] = market.run(go)
    return done


def test_every_dashboard_and_alert_expression_returns_data_that_agrees(
    market: Market, prometheus: tuple[Prometheus, Any]
) -> None:
    prom, _ = prometheus
    done = drive(market)
    prom.wait(
        "the forged purchase is counted",
        lambda: prom.value('sum(emarket_rejections_total{reason="bad_signature"})') == 1,
    )
    time.sleep(3)  # a few more scrapes, so that every rate() has two samples after the events
    # the figures agree with what the test did
    assert prom.value('sum(emarket_purchases_total{outcome="fulfilled"})') == done["fulfilled"]
    assert prom.value("sum(emarket_revenue_minor_total)") == done["paid"]
    by_reason = {
        r["metric"]["reason"]: float(r["value"][1])
        for r in prom.query("sum by (reason) (emarket_rejections_total)")
    }
    assert by_reason == {
        "price_too_high": 1,
        "wrong_dimension": 1,
        "bad_signature": 1,
        "buyer_quota_exceeded": 1,
    }
    assert prom.value('emarket_buyer_quota_refusals_total{stream="shared",kind="purchase"}') == 1
    assert prom.value('sum(emarket_values_ingested_total{status="accepted"})') == 9
    units = {
        r["metric"]["stream"]: r["metric"]["unit"] for r in prom.query("emarket_privacy_spent")
    }
    assert units == {"temp": "epsilon", "load": "rho", "home": "epsilon"}
    assert prom.value('emarket_privacy_spent{stream="temp"}') == 4.0
    assert prom.value('emarket_privacy_window_spent{stream="home"}') == 1.0
    assert prom.value('emarket_privacy_window_headroom{stream="home"}') == 0.0
    assert prom.value('emarket_deliveries_withheld_total{stream="home"}') == 1
    # every panel of the dashboard has data (no panel that can only say "no data")
    empty = [e for e in dashboard_exprs() if not prom.query(e)]
    assert not empty, f"dashboard expressions without data: {empty}"
    nan = [e for e in dashboard_exprs() if any(r["value"][1] == "NaN" for r in prom.query(e))]
    assert not nan, f"dashboard expressions that are NaN: {nan}"
    # every quantity an alert compares exists, so each alert can fire
    quantities = [(r["alert"], q) for r in alert_rules() for q in measured(r["expr"])]
    empty = [(name, q) for name, q in quantities if not prom.query(q)]
    assert not empty, f"alert quantities without data: {empty}"
    # and only the alert that should fire does: temp has released its whole cap (pending ones
    # are ignored: on a busy machine one slow scrape makes `up` 0 for a second)
    firing = {
        (a["labels"]["alertname"], a["labels"].get("stream"))
        for a in prom.api("alerts")["alerts"]
        if a["state"] == "firing"
    }
    assert firing == {("MarketPrivacyNearCap", "temp")}, firing


def test_a_stalled_worker_is_what_the_stall_alert_sees(market: Market, tmp_path: Path) -> None:
    """One event hangs the worker: /health says "stalled", Prometheus sees emarket_stalled = 1
    and the MarketWorkerStalled alert becomes pending (it fires after its minute)."""
    w = market.start_worker_env({"EMARKET_HANG": "stuck", "EMARKET_STALL_SECONDS": "2"})
    prom = Prometheus(tmp_path, [w.url.removeprefix("http://")])
    try:
        prom.wait("the worker is scraped", lambda: prom.value('up{job="epsilon-market"}') == 1)
        assert prom.value("emarket_stalled") == 0
        market.open_accounts("seller1")
        m = market.topics.prefix

        async def go(c: MarketClient) -> None:
            await c.register(
                {
                    "stream_id": "temp",
                    "mechanism": "laplace",
                    "sensitivity": 1.0,
                    "dimension": 3,
                    "steps": [1.0],
                    "cap": 1.0,
                    "retain_last": 4,
                    "pricing": LinearLevelSpec(rate_per_level=1.0),
                }
            )
            for vid in ("stuck", "v1", "v2"):  # input waits behind the stuck event
                await c.send(
                    c.topics.values,
                    "temp",
                    helpers.value("temp", vid, [1.0, 2.0, 3.0], market=m, published_at_ms=now_ms()),
                )

        market.run(go)
        prom.wait("Prometheus sees the stall", lambda: prom.value("emarket_stalled") == 1)

        def stall_alert() -> bool:
            alerts = prom.api("alerts")["alerts"]
            return any(a["labels"]["alertname"] == "MarketWorkerStalled" for a in alerts)

        prom.wait("the stall alert is pending", stall_alert)
    finally:
        prom.stop()
