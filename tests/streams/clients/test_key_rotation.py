"""Reading a whole sealed history after ``account rotate``, as a person does it with the CLI
(docs/protocol.md §4.6, §5.2), and an account shared between the Python and Node clients."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streams.clients.keys import Party
from streams.wire.events import LinearLevelSpec, Rejection
from streams.wire.signing import key_id_of

from ..conftest import Market

ROOT = Path(__file__).resolve().parents[3]
NODE_DIR = ROOT / "clients" / "node"
NODE = shutil.which("node")

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return _run_all([(cmd, cwd)])[0]


def _run_all(cmds: list[tuple[list[str], Path]]) -> list[subprocess.CompletedProcess[str]]:
    """Run ``cmds`` at once (readers of one inbox, which wait for it to go quiet), each to its
    end; none may print a traceback."""
    procs = [
        subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cmd, cwd in cmds
    ]
    out = []
    for (cmd, _), p in zip(cmds, procs, strict=True):
        stdout, stderr = p.communicate(timeout=120)
        assert "Traceback" not in stderr, stderr
        out.append(subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr))
    return out


def _seller(market: Market) -> None:
    """A stream of two values, steps 0.5, 1 and 2 at 1.00 EUR a level."""
    market.open_accounts("seller1")
    fields = {
        "stream_id": "temp",
        "mechanism": "laplace",
        "sensitivity": 1.0,
        "dimension": 2,
        "steps": [0.5, 1.0, 2.0],
        "cap": 4.0,
        "pricing": LinearLevelSpec(rate_per_level=100.0),
    }

    async def go(c: Any) -> None:
        assert not isinstance(await c.register(fields), Rejection)
        for i in range(2):
            await c.publish("temp", [float(i), 1.0], value_id=f"v{i}")

    market.run(go)
    market.wait_ingested("temp", 2)


def _bought(lines: str) -> list[dict[str, Any]]:
    return [ev for ev in map(json.loads, lines.splitlines()) if ev["type"] == "purchase_fulfilled"]


def test_tail_reads_the_whole_sealed_history_after_a_rotation(
    market: Market, tmp_path: Path
) -> None:
    """Open, buy, rotate, buy: ``tail`` with the new key file opens both purchases (the new
    file keeps the retired sealing key); a key file without it names the record sealed to
    version 1 and the flag that opens it, and opens the rest; with ``--old-key-file`` all open;
    the Node client's ``tail`` reads the same key file alike; and an account the Node client
    made and opened is the Python CLI's to use."""
    market.start_worker()
    _seller(market)
    pre = ["--broker", market.broker.url, "--prefix", market.topics.prefix]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return _run([sys.executable, "-m", "streams", *pre, *args], tmp_path)

    old, new = tmp_path / "alice.key", tmp_path / "alice-2.key"
    for path in (old, new):
        assert cli("keygen", "--account", "alice", "--out", str(path)).returncode == 0
    assert cli("account", "open", "--key-file", str(old)).returncode == 0
    buy = ["buy", "--stream", "temp", "--max-price", "5"]
    assert cli(*buy, "--key-file", str(old)).returncode == 0
    r = cli(
        "account", "rotate", "--key-file", str(old), "--new-key-file", str(new), "--version", "2"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rotated = r.stdout
    assert cli(*buy, "--key-file", str(new)).returncode == 0

    # a key file that does not keep the retired key: what a rotation on main left behind
    bare = tmp_path / "alice-bare.key"
    keys = Party.load(new)
    Party(keys.account_id, keys.signing_key, keys.sealing_key, keys.key_version).save(bare)
    py = [sys.executable, "-m", "streams", *pre, "tail"]
    node = [NODE or "node", "bin/emarket.js", "--broker", market.broker.bootstrap, *pre[2:]]
    with_node = NODE is not None and (NODE_DIR / "node_modules").is_dir()
    tails = _run_all(
        [
            ([*py, "--key-file", str(new), "--json"], tmp_path),
            ([*py, "--key-file", str(bare)], tmp_path),
            ([*py, "--key-file", str(bare), "--old-key-file", str(old), "--json"], tmp_path),
        ]
        + (
            [
                ([*node, "--key-file", str(new), "tail", "--wait", "1", "--json"], NODE_DIR),
                ([*node, "--key-file", str(bare), "tail", "--wait", "1"], NODE_DIR),
            ]
            if with_node
            else []
        )
    )
    r = tails[0]
    assert r.returncode == 0 and [len(e["releases"]) for e in _bought(r.stdout)] == [2, 2], r
    assert "not opened" not in r.stderr
    r = tails[1]
    said = (
        "not opened: its releases are sealed to the account's keys of version 1 (key id "
        f"{key_id_of(Party.load(old).public_key)}), which none of the key files given holds: "
        "pass the key file of version 1 with --old-key-file FILE"
    )
    assert r.returncode == 0 and said in r.stdout, r.stdout + r.stderr
    assert r.stdout.count("not opened") == 1 and ": 2 values" in r.stdout, r.stdout
    assert "1 sealed record(s) above could not be opened" in r.stderr
    r = tails[2]
    assert [len(e["releases"]) for e in _bought(r.stdout)] == [2, 2], r.stdout + r.stderr
    assert f"retired sealing keys (1), so `tail --key-file {new}` opens" in rotated
    if not with_node:
        return
    r = tails[3]
    assert r.returncode == 0 and [len(e["releases"]) for e in _bought(r.stdout)] == [2, 2], r
    r = tails[4]
    assert "not opened: its releases are sealed to the account's keys of version 1" in r.stdout
    assert "pass the key file of version 1 with --old-key-file FILE" in r.stdout

    nora = tmp_path / "nora.key"
    made = _run([*node, "keygen", "--account", "nora", "--out", str(nora)], NODE_DIR)
    assert made.returncode == 0, made.stderr
    r = _run([*node, "--key-file", str(nora), "account", "open"], NODE_DIR)
    assert r.returncode == 0, r.stderr
    r = cli(*buy, "--key-file", str(nora), "--json")  # opened and checked with Node's key file
    assert r.returncode == 0 and len(json.loads(r.stdout)["releases"]) == 2, r.stdout + r.stderr
