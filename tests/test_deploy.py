"""Static checks of the production deployment files (no Docker engine runs here).

They parse every file, check that everything a file references exists, that Prometheus scrapes
exactly the workers' metrics ports, and that every metric the alerts and the dashboard query is
one the workers actually export.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from streams.worker.metrics import build_metrics

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
WORKERS = {k: v for k, v in SERVICES.items() if k.startswith("worker")}


def exported_metric_names() -> set[str]:
    m = build_metrics()
    m.privacy_spent.labels("s", "laplace", "epsilon").set(1)
    m.privacy_cap.labels("s", "laplace", "epsilon").set(1)
    for g in (m.window_spent, m.window_cap, m.window_headroom):
        g.labels("s", "laplace", "epsilon").set(1)
    m.withheld.labels("s").inc()
    m.revenue.labels("s", "EUR").inc()
    m.state_entries.labels("t").set(1)
    m.consumer_lag.labels("t").set(1)
    m.values.labels("laplace", "accepted").inc()
    m.rejections.labels("r").inc()
    m.noise_draws.labels("laplace").inc()
    m.registrations.labels("accepted").inc()
    m.dead_letters.labels("too_large").inc()
    m.accounts.labels("opened").inc()
    text = generate_latest(m.registry).decode()
    return {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"
    }


def queried_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\b(emarket_[a-z_]+)", expr))


def test_compose_has_the_production_shape() -> None:
    assert SERVICES["kafka"]["image"].startswith("apache/kafka:")
    env = SERVICES["kafka"]["environment"]
    assert "controller" in env["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert env["KAFKA_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512"
    assert env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    assert len(WORKERS) == 2
    assert {"prometheus", "grafana", "kafka-init"} <= set(SERVICES)
    for w in WORKERS.values():
        assert w["environment"]["EMARKET_BROKER"] == "kafka://kafka:9092"
        assert w["environment"]["EMARKET_STORE"] == "rocksdb://"


def test_every_referenced_file_exists() -> None:
    for name, svc in SERVICES.items():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (ROOT / src).exists(), f"{name} mounts missing {src}"
        build = svc.get("build")
        if build:
            assert (ROOT / build["context"] / build["dockerfile"]).exists()
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), f"Dockerfile copies missing {src}"
    assert (ROOT / "deploy/prometheus/prometheus.yml").exists()


def test_prometheus_scrapes_exactly_the_worker_ports() -> None:
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    (job,) = prom["scrape_configs"]
    targets = {t for sc in job["static_configs"] for t in sc["targets"]}
    expected = {f"{name}:{w['environment']['EMARKET_WEB_PORT']}" for name, w in WORKERS.items()}
    assert targets == expected
    assert job["metrics_path"] == "/metrics"
    mounted = [v.split(":")[1] for v in SERVICES["prometheus"]["volumes"] if v.startswith(".")]
    assert all(f in mounted for f in prom["rule_files"])


def test_alerts_and_dashboard_query_real_metrics() -> None:
    names = exported_metric_names()
    alerts = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    exprs = [r["expr"] for g in alerts["groups"] for r in g["rules"]]
    dash = json.loads((ROOT / "deploy/grafana/dashboards/epsilon-market.json").read_text())
    exprs += [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = set().union(*(queried_metrics(e) for e in exprs))
    assert used, "no metric queried"
    assert used <= names, f"queried but not exported: {sorted(used - names)}"
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


def test_grafana_provisioning_matches_mounts() -> None:
    prov = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/dashboards/dashboards.yml").read_text()
    )
    path = prov["providers"][0]["options"]["path"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in SERVICES["grafana"]["volumes"]}
    assert (ROOT / mounts[path]).is_dir()
    ds = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    )
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"


def test_worker_environment_is_understood() -> None:
    """Every EMARKET_* variable the deployment sets is read by the code (no silent typos)."""
    code = "".join(p.read_text() for p in (ROOT / "streams").rglob("*.py"))
    known = set(re.findall(r"EMARKET_[A-Z_]+", code))
    known |= {f"EMARKET_{n}" for n in re.findall(r'_env\("([A-Z_]+)"', code)}
    for w in WORKERS.values():
        for var in w["environment"]:
            if var.startswith("EMARKET_"):
                assert var in known, f"{var} is set in docker-compose.yml but never read"


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
def test_security_setup_script_is_valid_and_least_privilege() -> None:
    script = ROOT / "deploy/kafka/setup-security.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    # a party may read only its own inbox: no prefixed grant on inboxes for parties
    party_block = text.split("party() {", 1)[1].split("\n}\n", 1)[0]
    assert '--topic "$PREFIX.inbox.$name"' in party_block
    assert "prefixed" not in party_block
    assert "--operation Read" in party_block
    assert "rejections" not in party_block and "deadletters" not in party_block
    # the worker moves a misplaced signed event to its own input partition: it writes inputs
    worker_inputs = text.split("for t in accounts registrations values purchases; do", 1)[1]
    assert "--operation Write" in worker_inputs.split("done", 1)[0]
    # the admin connection authenticates; nothing runs as an anonymous principal
    assert "--command-config" in text and "ANONYMOUS" not in text


def test_no_listener_is_unauthenticated() -> None:
    env = SERVICES["kafka"]["environment"]
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(protocols.values()) == {"SASL_PLAINTEXT"}, protocols
    listeners = {entry.split("://")[0] for entry in env["KAFKA_LISTENERS"].split(",")}
    assert listeners == set(protocols)
    assert env["KAFKA_SUPER_USERS"] == "User:admin"
    assert "ANONYMOUS" not in yaml.safe_dump(COMPOSE)
    for name in protocols:
        key = f"KAFKA_LISTENER_NAME_{name}_SASL_ENABLED_MECHANISMS"
        assert key in env, f"listener {name} has no SASL mechanism"


def test_metrics_have_units_and_no_created_series() -> None:
    names = exported_metric_names()
    assert "emarket_consumer_lag_messages" in names
    assert not [n for n in names if n.endswith("_created")], sorted(names)


def test_outside_parties_reach_an_authenticated_published_listener() -> None:
    env = SERVICES["kafka"]["environment"]
    assert "EXTERNAL://:29092" in env["KAFKA_LISTENERS"]
    assert "EXTERNAL://${EMARKET_PUBLIC_HOST:-localhost}:29092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert env["KAFKA_LISTENER_NAME_EXTERNAL_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512"
    # published on loopback unless the operator chooses otherwise (docs: use TLS beyond it)
    assert SERVICES["kafka"]["ports"] == ["${EMARKET_PUBLIC_BIND:-127.0.0.1}:29092:29092"]
    docs = (ROOT / "docs/operations.md").read_text()
    assert "### Connecting from outside" in docs and "EMARKET_PUBLIC_HOST" in docs


def test_replication_is_one_setting_for_topics_and_workers() -> None:
    assert SERVICES["kafka-init"]["environment"]["REPLICATION"] == "${EMARKET_REPLICATION:-1}"
    for w in WORKERS.values():
        assert w["environment"]["EMARKET_REPLICATION"] == "${EMARKET_REPLICATION:-1}"
    assert '--replication-factor "${REPLICATION:-1}"' in (
        ROOT / "deploy/kafka/setup-security.sh"
    ).read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
def test_make_env_sets_every_required_secret_in_a_form_the_worker_loads(tmp_path: Path) -> None:
    from streams.worker.secrets import load_or_create_keys

    script = ROOT / "deploy/make-env.sh"
    out = subprocess.run(
        ["bash", str(script), "--sellers", "acme,s2", "--buyers", "alice"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    env = dict(line.split("=", 1) for line in out.splitlines() if line and line[0] != "#")
    required = set(re.findall(r"\$\{([A-Z_]+):\?", (ROOT / "docker-compose.yml").read_text()))
    assert required and required <= set(env), sorted(required - set(env))
    assert re.fullmatch(r"acme:[\w-]{32},s2:[\w-]{32}", env["EMARKET_SELLERS"])
    again = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True)
    assert env["EMARKET_NOISE_SECRET"] not in again.stdout  # fresh every time
    keys = load_or_create_keys(tmp_path, env)
    assert len(keys.noise_secret) == 32 and not list(tmp_path.iterdir())  # nothing generated
    bad = subprocess.run(
        ["bash", str(script), "--buyers", "a b"], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2 and bad.stdout == "" and "bad account id" in bad.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
@pytest.mark.parametrize(
    ("sellers", "buyers", "why"),
    [("admin:pw", "", "market's own principals"), ("acme:pw", "market-worker:pw", "own"),
     ("acme:pw", "operator:pw", "own"), ("acme:one", "acme:two", "twice"),
     ("acme", "", "id:password"), ("a b:pw", "", "id:password")],
)  # fmt: skip
def test_security_setup_refuses_parties_that_would_be_someone_else(
    sellers: str, buyers: str, why: str
) -> None:
    """Checked before anything is created: a buyer called `admin` would be a super user."""
    env = {"BOOTSTRAP": "127.0.0.1:1", "PREFIX": "p", "PARTITIONS": "1", "APP_ID": "a",
           "ADMIN_PASSWORD": "x", "WORKER_PASSWORD": "x", "OPERATOR_PASSWORD": "x",
           "SELLERS": sellers, "BUYERS": buyers, "PATH": "/usr/bin:/bin"}  # fmt: skip
    r = subprocess.run(["bash", str(ROOT / "deploy/kafka/setup-security.sh")], env=env,
                       capture_output=True, text=True, check=False, timeout=30)  # fmt: skip
    assert r.returncode == 2 and "refused" in r.stderr and why in r.stderr, r.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
def test_make_env_gives_a_party_that_sells_and_buys_one_password() -> None:
    script = str(ROOT / "deploy/make-env.sh")
    out = subprocess.run(["bash", script, "--sellers", "acme", "--buyers", "acme,bob"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    env = dict(line.split("=", 1) for line in out.splitlines() if line and line[0] != "#")
    assert env["EMARKET_SELLERS"].split(",")[0] == env["EMARKET_BUYERS"].split(",")[0]
    for bad in (["--buyers", "admin"], ["--sellers", "operator"], ["--buyers", "a,a"]):
        r = subprocess.run(["bash", script, *bad], capture_output=True, text=True, check=False)
        assert r.returncode == 2 and r.stdout == "", bad
