"""The alert rules and the Prometheus config, checked by Prometheus's own ``promtool``.

``promtool`` comes with Debian's ``prometheus`` package (``.ci/run`` installs it when missing);
without it these tests are skipped, saying so.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from streams.core.holds import MAX_PER_STREAM

ROOT = Path(__file__).resolve().parents[1]
PROM = ROOT / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed: apt-get install prometheus (.ci/run does)"
)


def promtool(*args: str) -> str:
    assert PROMTOOL is not None
    r = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout + r.stderr


def test_config_and_rules_are_valid(tmp_path: Path) -> None:
    """prometheus.yml as mounted by docker-compose (its rule file beside it)."""
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    config["rule_files"] = ["alerts.yml"]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    shutil.copy(PROM / "alerts.yml", tmp_path / "alerts.yml")
    assert "SUCCESS" in promtool("check", "config", str(tmp_path / "prometheus.yml"))
    out = promtool("check", "rules", str(PROM / "alerts.yml"))
    assert f"SUCCESS: {len(alert_names())} rules found" in out


def test_every_alert_fires_and_stays_silent_in_the_unit_tests() -> None:
    promtool("test", "rules", str(PROM / "alerts.test.yml"))
    spec = yaml.safe_load((PROM / "alerts.test.yml").read_text())
    fired, silent = set(), set()
    for group in spec["tests"]:
        for case in group["alert_rule_test"]:
            (fired if case["exp_alerts"] else silent).add(case["alertname"])
    assert fired == alert_names(), f"never seen firing: {sorted(alert_names() - fired)}"
    assert silent == alert_names(), f"never shown silent: {sorted(alert_names() - silent)}"


def test_a_broken_rule_fails_the_unit_tests(tmp_path: Path) -> None:
    """The unit tests can fail: the stalled-worker alert with a threshold nothing reaches."""
    rules = (PROM / "alerts.yml").read_text()
    broken = rules.replace(
        "max by (instance) (emarket_stalled) == 1", "max by (instance) (emarket_stalled) == 2"
    )
    assert broken != rules
    (tmp_path / "alerts.yml").write_text(broken)
    shutil.copy(PROM / "alerts.test.yml", tmp_path / "alerts.test.yml")
    assert PROMTOOL is not None
    r = subprocess.run(
        [PROMTOOL, "test", "rules", str(tmp_path / "alerts.test.yml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode != 0 and "MarketWorkerStalled" in r.stdout + r.stderr


def test_the_reservations_alert_names_the_market_s_own_bound() -> None:
    """The alert fires at the most reservations a stream holds: the bound of the code."""
    rules = yaml.safe_load((PROM / "alerts.yml").read_text())
    (rule,) = [
        r
        for g in rules["groups"]
        for r in g["rules"]
        if r["alert"] == "MarketReservationsSaturated"
    ]
    assert rule["expr"].endswith(f">= {MAX_PER_STREAM}")
    assert f"({MAX_PER_STREAM})" in rule["annotations"]["description"]


def alert_names() -> set[str]:
    rules = yaml.safe_load((PROM / "alerts.yml").read_text())
    return {r["alert"] for g in rules["groups"] for r in g["rules"]}
