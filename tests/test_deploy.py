"""Static checks of the production deployment files (no Docker engine runs here).

They parse every file, check that everything a file references exists, that Prometheus scrapes
exactly the workers' metrics ports, and that every metric the alerts and the dashboard query is
one the workers actually export.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import tomllib
import typing
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
    m.quota_refusals.labels("s", "purchase").inc()
    m.reservations_held.labels("s").set(1)
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
    kafka_image = (ROOT / SERVICES["kafka"]["build"]["dockerfile"]).read_text()
    assert "\nFROM apache/kafka:3.9.0\n" in kafka_image
    assert SERVICES["kafka-init"]["image"] == "apache/kafka:3.9.0"  # the same tools
    env = SERVICES["kafka"]["environment"]
    assert "controller" in env["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert env["KAFKA_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512"
    assert env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    assert len(WORKERS) == 2
    assert {"prometheus", "grafana", "kafka-init"} <= set(SERVICES)
    for w in WORKERS.values():
        assert w["environment"]["EMARKET_BROKER"] == "kafka://kafka:9092"
        assert w["environment"]["EMARKET_STORE"] == "rocksdb://"
        assert w["environment"]["EMARKET_OPENINGS"] == "${EMARKET_OPENINGS:-invite}"  # issue #40


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
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "epsilon-market"]
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
    assert 'inbox="$PREFIX.inbox.$name"' in party_block  # v1: its own topic
    assert '--operation Read --operation Describe --topic "$inbox"' in party_block
    # v2: the one shared, sealed inbox topic, made with the workers' partition count
    v2 = text.split('if [ "$INBOXES" = v2 ]; then', 1)[1].split("\nfi\n", 1)[0]
    assert 'topic "$PREFIX.inbox" "${INBOX_PARTITIONS:-16}"' in v2
    init = SERVICES["kafka-init"]["environment"]
    for w in WORKERS.values():
        assert w["environment"]["EMARKET_INBOXES"] == init["INBOXES"]
        assert w["environment"]["EMARKET_INBOX_PARTITIONS"] == init["INBOX_PARTITIONS"]
    assert "prefixed" not in party_block
    assert "--operation Read" in party_block
    assert "rejections" not in party_block and "deadletters" not in party_block
    # the worker moves a misplaced signed event to its own input partition: it writes inputs
    worker_inputs = text.split("for t in accounts registrations values purchases; do", 1)[1]
    assert "--operation Write" in worker_inputs.split("done", 1)[0]
    # the admin connection authenticates; nothing runs as an anonymous principal
    assert "--command-config" in text and "ANONYMOUS" not in text
    # every party is throttled by the broker (a flood of garbage costs the market nothing)
    assert '\n  quota "$name"\n' in party_block
    quota = text.split("quota() {", 1)[1].split("\n}\n", 1)[0]
    assert "producer_byte_rate=" in quota and "request_percentage=" in quota
    init = SERVICES["kafka-init"]["environment"]
    assert {"PARTY_PRODUCE_BYTES", "PARTY_REQUEST_PERCENT"} <= set(init)


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
    assert (
        '--replication-factor "${REPLICATION:-1}"'
        in (ROOT / "deploy/kafka/setup-security.sh").read_text()
    )


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
def test_make_env_sets_every_required_secret_in_a_form_the_worker_loads(tmp_path: Path) -> None:
    from streams.worker.secrets import load_or_create_keys

    script = ROOT / "deploy/make-env.sh"
    out = subprocess.run(
        ["bash", str(script), "--sellers", "acme,s2", "--buyers", "alice"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
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


def _security_setup(**env: str) -> subprocess.CompletedProcess[str]:
    """The setup script run with ``env`` over a minimal environment whose broker nobody
    answers on: what it refuses, it refuses before it connects."""
    base = {
        "BOOTSTRAP": "127.0.0.1:1",
        "PREFIX": "p",
        "PARTITIONS": "1",
        "APP_ID": "a",
        "ADMIN_PASSWORD": "x",
        "WORKER_PASSWORD": "x",
        "OPERATOR_PASSWORD": "x",
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        ["bash", str(ROOT / "deploy/kafka/setup-security.sh")],
        env=base | env,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
@pytest.mark.parametrize(
    ("sellers", "buyers", "why"),
    [
        ("admin:pw", "", "market's own principals"),
        ("acme:pw", "market-worker:pw", "own"),
        ("acme:pw", "operator:pw", "own"),
        ("acme:one", "acme:two", "twice"),
        ("acme", "", "id:password"),
        ("a b:pw", "", "id:password"),
    ],
)
def test_security_setup_refuses_parties_that_would_be_someone_else(
    sellers: str, buyers: str, why: str
) -> None:
    """Checked before anything is created: a buyer called `admin` would be a super user."""
    r = _security_setup(SELLERS=sellers, BUYERS=buyers)
    assert r.returncode == 2 and "refused" in r.stderr and why in r.stderr, r.stderr


def _acl_commands(text: str) -> list[str]:
    """Every ``acl`` command of the setup script, continuation lines joined."""
    joined = text.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip().startswith("acl ")]


def test_the_workers_group_and_state_are_theirs_alone() -> None:
    """Issue #39: the consumer group (the app id) and the workers' own topics (``$APP_ID-``:
    changelogs, the progress changelog, Faust's assignor topic) are granted to market-worker
    and to nobody else; no grant anywhere names every topic or group, or every principal."""
    text = (ROOT / "deploy/kafka/setup-security.sh").read_text()
    acls = _acl_commands(text)
    assert acls and not [a for a in acls if "'*'" in a or '"*"' in a or "User:*" in a]
    groups = [a for a in acls if "--group" in a]
    assert groups == ['acl "${W[@]}" --operation Read --operation Describe --group "$APP_ID"']
    state = [a for a in acls if '"$APP_ID-"' in a]
    assert len(state) == 1 and state[0].startswith('acl "${W[@]}"'), state
    ops = set(re.findall(r"--operation (\w+)", state[0]))
    assert ops == {"Read", "Write", "Create", "Describe", "DescribeConfigs"}, ops  # no Delete
    assert "--resource-pattern-type prefixed" in state[0]
    others = [a for a in acls if not a.startswith('acl "${W[@]}"')]
    assert others and not [a for a in others if "APP_ID" in a or "--group" in a], others
    assert "ALLOW_EVERYONE_IF_NO_ACL_FOUND" in yaml.safe_dump(SERVICES["kafka"]["environment"])


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
@pytest.mark.parametrize(("prefix", "app_id"), [("p", "p.inbox.bob"), ("a-x", "a")])
def test_security_setup_refuses_an_app_id_and_prefix_that_share_topics(
    prefix: str, app_id: str
) -> None:
    """A party's inbox (``$PREFIX.inbox.<id>``) must never be one of the workers' topics."""
    r = _security_setup(PREFIX=prefix, APP_ID=app_id, SELLERS="acme:pw", BUYERS="")
    assert r.returncode == 2 and "refused" in r.stderr and "names topics inside" in r.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
def test_make_env_gives_a_party_that_sells_and_buys_one_password() -> None:
    script = str(ROOT / "deploy/make-env.sh")
    out = subprocess.run(
        ["bash", script, "--sellers", "acme", "--buyers", "acme,bob"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if line and line[0] != "#")
    assert env["EMARKET_SELLERS"].split(",")[0] == env["EMARKET_BUYERS"].split(",")[0]
    for bad in (["--buyers", "admin"], ["--sellers", "operator"], ["--buyers", "a,a"]):
        r = subprocess.run(["bash", script, *bad], capture_output=True, text=True, check=False)
        assert r.returncode == 2 and r.stdout == "", bad


ALERTMANAGER = ROOT / "deploy/alertmanager"


def alert_severities() -> dict[str, str]:
    alerts = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    return {r["alert"]: r["labels"]["severity"] for g in alerts["groups"] for r in g["rules"]}


def route_of(route: dict[str, Any], labels: dict[str, str]) -> str:
    """The receiver Alertmanager picks for ``labels`` (first matching child, else the parent);
    matchers of the forms ``name="value"`` and ``name=~"regex"``, the only ones used."""
    for child in route.get("routes", []):
        if all(_matches(m, labels) for m in child["matchers"]):
            assert not child.get("continue"), "a route that continues would notify twice"
            return route_of(child, labels)
    return str(route["receiver"])


def _matches(matcher: str, labels: dict[str, str]) -> bool:
    m = re.fullmatch(r'(\w+)(=~|=)"(.*)"', matcher)
    assert m, f"unsupported matcher {matcher!r}"
    name, op, value = m.groups()
    got = labels.get(name, "")
    return got == value if op == "=" else re.fullmatch(value, got) is not None


def test_every_alert_severity_has_its_own_route() -> None:
    config = yaml.safe_load((ALERTMANAGER / "alertmanager.yml").read_text())
    receivers = {r["name"] for r in config["receivers"]}
    explicit = {m for r in config["route"]["routes"] for m in r["matchers"]}
    severities = set(alert_severities().values())
    assert severities == {"page", "ticket", "info"}, severities
    for severity in severities:
        assert f'severity="{severity}"' in explicit, f"{severity} only reaches the default"
    got = {s: route_of(config["route"], {"severity": s}) for s in severities}
    assert got == {"page": "page", "ticket": "ticket", "info": "ticket"}
    assert set(got.values()) <= receivers
    # every receiver's URL comes from a variable compose hands to the container
    env = SERVICES["alertmanager"]["environment"]
    for r in config["receivers"]:
        (hook,) = r["webhook_configs"]
        var = re.fullmatch(r"\$\{(EMARKET_ALERT_[A-Z_]+)\}", hook["url"])
        assert var and var[1] in env, hook
        assert env[var[1]].startswith(f"${{{var[1]}:-http://"), env[var[1]]


def render_alertmanager(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    tmp_path.mkdir(exist_ok=True)
    out = tmp_path / "alertmanager.yml"
    return subprocess.run(
        ["sh", str(ALERTMANAGER / "render.sh"), str(ALERTMANAGER / "alertmanager.yml"), str(out)],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.skipif(shutil.which("awk") is None, reason="awk not available")
def test_alertmanager_config_renders_from_the_environment(tmp_path: Path) -> None:
    page = "https://hooks.example.org/page?token=a&b=|\\1$x"  # no character is special
    r = render_alertmanager(
        tmp_path, EMARKET_ALERT_PAGE_URL=page, EMARKET_ALERT_TICKET_URL="http://tickets:8080/"
    )
    assert r.returncode == 0, r.stderr
    rendered = yaml.safe_load((tmp_path / "alertmanager.yml").read_text())
    urls = {x["name"]: x["webhook_configs"][0]["url"] for x in rendered["receivers"]}
    assert urls == {"page": page, "ticket": "http://tickets:8080/"}
    if shutil.which("amtool"):  # Debian: prometheus-alertmanager
        check = subprocess.run(
            ["amtool", "check-config", str(tmp_path / "alertmanager.yml")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr
    # a receiver without a URL stops the start, naming what to set
    r = render_alertmanager(tmp_path / "x", EMARKET_ALERT_PAGE_URL=page)
    assert r.returncode == 2 and "EMARKET_ALERT_TICKET_URL" in r.stderr, r.stderr
    compose = SERVICES["alertmanager"]
    assert compose["entrypoint"][1:] == [
        "/etc/alertmanager/render.sh",
        "/etc/alertmanager/alertmanager.yml",
        "/alertmanager/alertmanager.yml",
    ]
    assert "--config.file=/alertmanager/alertmanager.yml" in compose["command"]


@pytest.mark.skipif(
    shutil.which("amtool") is None,
    reason="amtool not installed (apt-get install prometheus-alertmanager)",
)
def test_amtool_routes_each_alert_to_its_receiver(tmp_path: Path) -> None:
    r = render_alertmanager(
        tmp_path, EMARKET_ALERT_PAGE_URL="http://p/", EMARKET_ALERT_TICKET_URL="http://t/"
    )
    assert r.returncode == 0, r.stderr
    expected = {"page": "page", "ticket": "ticket", "info": "ticket"}
    for alert, severity in alert_severities().items():
        out = subprocess.run(
            [
                "amtool",
                "config",
                "routes",
                "test",
                "--config.file",
                str(tmp_path / "alertmanager.yml"),
                f"alertname={alert}",
                f"severity={severity}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
        assert out == expected[severity], (alert, out)


def test_prometheus_alerts_through_the_alertmanager_and_scrapes_kafka() -> None:
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    (am,) = prom["alerting"]["alertmanagers"]
    assert am["static_configs"] == [{"targets": ["alertmanager:9093"]}]
    assert "alertmanager" in SERVICES
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    (kafka_target,) = jobs["kafka"]["static_configs"][0]["targets"]
    env = SERVICES["kafka"]["environment"]
    agent = re.fullmatch(r"-javaagent:(\S+\.jar)=(\d+):(\S+)", env["KAFKA_OPTS"])
    assert agent, env["KAFKA_OPTS"]
    jar, port, config = agent.groups()
    assert kafka_target == f"kafka:{port}"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in SERVICES["kafka"]["volumes"]}
    rules = yaml.safe_load((ROOT / mounts[config]).read_text())
    assert rules["rules"] and all("pattern" in r and "name" in r for r in rules["rules"])
    dockerfile = (ROOT / SERVICES["kafka"]["build"]["dockerfile"]).read_text()
    add = re.search(
        r"ADD --chmod=644 \\\s+--checksum=sha256:([0-9a-f]{64}) \\\s+(\S+) \\\s+(\S+)", dockerfile
    )
    assert add, "the agent is fetched at a pinned version and checked"
    version = re.search(
        r"/jmx_prometheus_javaagent/([\d.]+)/jmx_prometheus_javaagent-\1\.jar$", add[2]
    )
    assert version and version[1] in SERVICES["kafka"]["image"]
    assert add[3] == jar
    # a Kafka tool run in the container must not start a second agent on the same port
    health = SERVICES["kafka"]["healthcheck"]["test"][1]
    assert "KAFKA_OPTS= /opt/kafka/bin/kafka-topics.sh" in health
    assert "KAFKA_OPTS" not in SERVICES["kafka-init"]["environment"]


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b'{"status": "..."}')

    def log_message(self, *args: Any) -> None:
        pass


def test_worker_healthcheck_fails_when_health_says_503() -> None:
    """The compose healthcheck, run here against a stand-in for the worker's /health."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for w in WORKERS.values():
            check = w["healthcheck"]
            cmd, python, *args = check["test"]
            assert (cmd, python) == ("CMD", "python")
            env = {**os.environ, "EMARKET_WEB_PORT": str(server.server_address[1])}
            for status, ok in ((200, True), (503, False)):
                _Health.status = status
                r = subprocess.run(
                    [sys.executable, *args], env=env, capture_output=True, timeout=30, check=False
                )
                assert (r.returncode == 0) == ok, (status, r.stderr)
            assert w["environment"]["EMARKET_WEB_PORT"] == "6066"
            assert check["start_period"] and check["retries"] >= 2
    finally:
        server.shutdown()
        server.server_close()


def test_a_worker_the_market_refuses_is_restarted_a_bounded_number_of_times() -> None:
    from streams.clients.commands.operator import EXIT_IDENTITY

    for w in WORKERS.values():
        m = re.fullmatch(r"on-failure:(\d+)", w["restart"])
        assert m and 1 <= int(m[1]) <= 10, w["restart"]
        assert "restart_policy" not in w.get("deploy", {})  # one policy, not two
    docs = (ROOT / "docs/operations.md").read_text()
    assert f"exit {EXIT_IDENTITY}" in docs and "on-failure:" in docs


def test_constraints_pin_every_runtime_dependency() -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = [Requirement(r) for r in project["dependencies"]]
    runtime += [Requirement(r) for r in project["optional-dependencies"]["service"]]
    pins: dict[str, str] = {}
    for line in (ROOT / "deploy/constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    assert len(pins) > len(runtime)  # their dependencies too
    for req in runtime:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in deploy/constraints.txt"
        assert req.specifier.contains(pins[name]), (
            f"{req.name}=={pins[name]} is outside pyproject's {req.specifier}: "
            "run deploy/make-constraints.py"
        )
    dev_only = {"pytest", "mypy", "ruff", "hypothesis", "matplotlib"}
    assert not dev_only & set(pins), "test and report tools do not belong in the image"
    dockerfile = (ROOT / "deploy/Dockerfile").read_text()
    assert "pip install -c deploy/constraints.txt '.[service]'" in dockerfile


def tls_handshake(ca: Path, cert: Path, key: Path, name: str) -> None:
    """A TLS handshake from the client library's context (``EMARKET_KAFKA_CA``) to a server
    presenting ``cert``, checking the name ``name``."""
    from streams.broker.auth import kafka_auth

    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = kafka_auth("alice", "pw", security="SASL_SSL", cafile=str(ca))["ssl_context"]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def serve() -> None:
            conn, _ = listener.accept()
            with (
                contextlib.suppress(ssl.SSLError, OSError),
                server_ctx.wrap_socket(conn, server_side=True) as tls,
            ):
                tls.recv(1)

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        with (
            socket.create_connection(listener.getsockname(), timeout=10) as raw,
            client_ctx.wrap_socket(raw, server_hostname=name) as tls,
        ):
            tls.sendall(b"x")
        t.join(10)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
@pytest.mark.slow
def test_tls_script_makes_material_clients_verify(tmp_path: Path) -> None:
    out = tmp_path / "tls"
    script = str(ROOT / "deploy/make-tls.sh")
    r = subprocess.run(
        [
            "bash",
            script,
            "--host",
            "market.example.org",
            "--host",
            "203.0.113.7",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    for secret in ("ca.key", "broker.key", "broker.p12", "keystore.password"):
        assert (out / secret).stat().st_mode & 0o077 == 0, f"{secret} is readable by others"
    ca, cert, key = out / "ca.pem", out / "broker.pem", out / "broker.key"
    for name in ("market.example.org", "203.0.113.7", "kafka", "localhost"):
        tls_handshake(ca, cert, key, name)
    with pytest.raises(ssl.SSLCertVerificationError):
        tls_handshake(ca, cert, key, "elsewhere.example.org")
    # the keystore opens with its password and holds the key and the chain to the CA
    chain = subprocess.run(
        [
            "openssl",
            "pkcs12",
            "-in",
            str(out / "broker.p12"),
            "-nokeys",
            "-passin",
            f"file:{out / 'keystore.password'}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert chain.count("BEGIN CERTIFICATE") == 2
    if shutil.which("keytool"):
        listed = subprocess.run(
            [
                "keytool",
                "-list",
                "-keystore",
                str(out / "truststore.p12"),
                "-storepass:file",
                str(out / "truststore.password"),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "trustedCertEntry" in listed
    # again: the CA is kept (clients keep trusting it), the broker certificate is new
    first = cert.read_text()
    subprocess.run(
        ["bash", script, "--host", "other.example.org", "--out", str(out)],
        capture_output=True,
        check=True,
        timeout=120,
    )
    assert cert.read_text() != first
    tls_handshake(ca, cert, key, "other.example.org")
    bad = subprocess.run(
        ["bash", script, "--out", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "--host" in bad.stderr
    docs = (ROOT / "docs/operations.md").read_text()
    assert "deploy/make-tls.sh" in docs


def test_documented_account_outcomes_are_the_ones_counted() -> None:
    """`emarket_account_events_total{outcome}` takes an account event's outcome status."""
    from streams.core.outputs import Status
    from tests.streams import helpers

    core = helpers.market_core()
    t = core.ctx.topics
    opened = helpers.account("alice")
    seen = {
        core.handle(t.accounts, opened).status,
        core.handle(t.accounts, opened).status,
        core.handle(t.accounts, b"{not json").status,
    }
    assert seen == {"accepted", "duplicate", "rejected"}
    docs = (ROOT / "docs/operations.md").read_text()
    (row,) = [line for line in docs.splitlines() if line.startswith("| `emarket_account_events")]
    documented = set(re.findall(r"`(\w+)`", row)) & set(typing.get_args(Status))
    assert documented == seen, row


def test_every_env_recipe_keeps_the_secrets_private() -> None:
    """Each recipe that writes the secrets to .env does it under ``umask 077``: a shell's usual
    umask (022) leaves the file readable by every user of the host. The compose file's header
    omitted it while operations.md had it."""
    files = [ROOT / "docker-compose.yml", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    files.append(ROOT / "deploy" / "make-env.sh")
    recipes = [
        (path.name, line)
        for path in files
        for line in path.read_text().splitlines()
        if re.search(r"make-env\.sh\b.*>\s*\.env", line)
    ]
    assert len(recipes) >= 3, recipes  # compose, operations.md, the script's own usage
    for name, line in recipes:
        assert re.search(r"\(umask 077;[^)]*make-env\.sh[^)]*> ?\.env\)", line), (name, line)


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
def test_security_setup_refuses_an_inbox_layout_it_does_not_know() -> None:
    """``INBOXES`` is the workers' ``EMARKET_INBOXES``: a typo would make no inbox at all."""
    r = _security_setup(SELLERS="acme:pw", INBOXES="2")
    assert r.returncode == 2 and "neither v1 nor v2" in r.stderr, r.stderr
