"""Key files (docs/protocol.md §5.2): the format both clients read and write, the retired sealing
keys a rotation keeps, and a key file others can read, which is said (not silently accepted)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from streams.clients.keys import KeyFileError, Party, SealingKey

ROOT = Path(__file__).resolve().parents[3]
NODE_DIR = ROOT / "clients" / "node"
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(
    NODE is None or not (NODE_DIR / "node_modules").is_dir(),
    reason="node (and clients/node/node_modules) needed to run the Node client",
)


def vector_text() -> str:
    """The key file of §5.2.1, as the bytes a writer produces."""
    text = (ROOT / "docs" / "protocol.md").read_text()
    got = re.search(
        r"<!-- key file vectors: begin -->\s*```json\n(.*?\n)```\s*<!-- key file vectors: end -->",
        text,
        re.S,
    )
    assert got is not None, "docs/protocol.md lost its key file vector (§5.2.1)"
    return got.group(1)


def vector_party() -> Party:
    return Party(
        "alice",
        Ed25519PrivateKey.from_private_bytes(bytes(range(0x40, 0x60))),
        X25519PrivateKey.from_private_bytes(bytes(range(0x60, 0x80))),
        2,
        (SealingKey(1, X25519PrivateKey.from_private_bytes(bytes(range(0x20, 0x40)))),),
    )


def private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_the_key_file_vector_is_what_the_client_reads_and_writes(tmp_path: Path) -> None:
    """§5.2.1: the file reads into the listed keys, and the same keys are written into the
    same 542 bytes (SHA-256 as stated)."""
    text = vector_text()
    assert len(text.encode()) == 542
    assert hashlib.sha256(text.encode()).hexdigest() == (
        "90771144fb726afbb37a8fc3738ebb0688063debf4c4ed2f28c810f50e23f574"
    )
    got = Party.load(private(tmp_path / "alice.key", text))
    assert got.key_version == 2 and got.account_id == "alice"
    assert got.public_key == "JUO5L/EJVRFHatyDadtt3JM2ZaEZeN2hQE7hBmypVZ0="
    assert [(k.version, k.public_key) for k in got.sealing_keys] == [
        (2, "Z13VdO13iTELPS52gfN5C0ZsdzsVIf7PNld5WDcepS8="),
        (1, "NYBy1jZYgNGu6jKa35EhODhR7SGijjt16WXQ0s0WYlQ="),  # §2.4's signer's sealing key
    ]
    assert vector_party().key_file() == text == got.key_file()
    vector_party().save(tmp_path / "again.key")
    assert (tmp_path / "again.key").read_text() == text


def test_earlier_formats_are_read(tmp_path: Path) -> None:
    """The Python CLI's format 1 and the Node client's first files (§5.2.2) still open."""
    me = vector_party()
    raw = json.loads(vector_text())
    v1 = {
        "version": 1,
        "account_id": "alice",
        "signing_key": raw["signing_private_key"],
        "sealing_key": raw["sealing_private_key"],
        "key_version": 2,
    }
    node = {
        "account_id": "alice",
        "signing_private_key": bytes(range(0x40, 0x60)).hex(),
        "signing_key": me.public_key,
        "sealing_private_key": bytes(range(0x60, 0x80)).hex(),
        "sealing_key": me.sealing_public_key,
        "key_version": 2,
    }
    for name, doc in (("v1", v1), ("node", node)):
        got = Party.load(private(tmp_path / f"{name}.key", json.dumps(doc)))
        assert (got.public_key, got.sealing_public_key, got.key_version) == (
            me.public_key,
            me.sealing_public_key,
            2,
        )


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"version": 3}, "format version 3"),
        ({"signing_key": "A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg="}, "`signing_key` is not"),
        ({"sealing_private_key": "c2hvcnQ="}, "`sealing_private_key` must be base64 of 32"),
        ({"key_version": 0}, "`key_version` must be an integer"),
        ({"key_version": 1}, "`previous` must list distinct versions below `key_version`"),
        ({"account_id": "a b"}, "`account_id` must be"),
    ],
)
def test_a_malformed_key_file_is_refused_saying_what_is_wrong(
    tmp_path: Path, change: dict[str, object], says: str
) -> None:
    doc = {**json.loads(vector_text()), **change}
    path = private(tmp_path / "bad.key", json.dumps(doc))
    with pytest.raises(KeyFileError, match=re.escape(says)) as err:
        Party.load(path)
    assert str(path) in str(err.value) and "§5.2" in str(err.value)


def test_a_rotation_keeps_the_old_sealing_key_once_per_version() -> None:
    """``retiring`` is what ``account rotate`` writes: the old ``previous`` plus the old key."""
    old = vector_party()
    kept = old.retiring(2)
    assert [(k.version, k.public_key) for k in kept] == [
        (1, "NYBy1jZYgNGu6jKa35EhODhR7SGijjt16WXQ0s0WYlQ="),
        (2, "Z13VdO13iTELPS52gfN5C0ZsdzsVIf7PNld5WDcepS8="),
    ]
    again = Party("alice", old.signing_key, old.sealing_key, 3, kept).retiring(3)
    assert [k.version for k in again] == [1, 3]  # the same key twice: kept at its newest version
    stranger = Party.generate("bob")
    with pytest.raises(KeyFileError, match="account 'bob'"):
        old.holding([stranger])


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMARKET_")}
    return subprocess.run(
        [sys.executable, "-m", "streams", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**env, "PYTHONPATH": str(ROOT)},
        check=False,
    )


def test_a_key_file_others_can_read_is_warned_about(tmp_path: Path) -> None:
    """The file is read (the command goes on to its next error, no broker here), and stderr
    names the file, its mode and `chmod 600`; the library warns the same way."""
    path = tmp_path / "loose.key"
    assert _cli("keygen", "--account", "alice", "--out", str(path), cwd=tmp_path).returncode == 0
    path.chmod(0o644)
    r = _cli("account", "open", "--key-file", str(path), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"the key file {path} can be read or changed by other users (mode 0644)" in r.stderr
    assert f"chmod 600 {path}" in r.stderr and "needs a broker" in r.stderr
    with pytest.warns(UserWarning, match="chmod 600"):
        Party.load(path)
    path.chmod(0o600)
    assert "warning" not in _cli("account", "open", "--key-file", str(path), cwd=tmp_path).stderr


def test_key_files_are_written_for_their_owner_alone(tmp_path: Path) -> None:
    """Whatever the umask, and over a file that was readable by others (a rotation)."""
    old = os.umask(0)
    try:
        r = _cli("keygen", "--account", "alice", "--out", "a.key", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        loose = tmp_path / "b.key"
        loose.write_text(vector_text())
        loose.chmod(0o666)
        vector_party().save_over(loose)
    finally:
        os.umask(old)
    assert (tmp_path / "a.key").stat().st_mode & 0o777 == 0o600
    assert loose.stat().st_mode & 0o777 == 0o600


def _node(script: str, *args: str) -> str:
    assert NODE is not None
    r = subprocess.run(
        [NODE, "--input-type=module", "-e", script, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=NODE_DIR,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


@needs_node
def test_python_and_node_read_each_others_key_files(tmp_path: Path) -> None:
    """A key file the Node client wrote is the Python CLI's, and back: same keys, same bytes;
    the Node client reads the vector, and warns of a loose file as Python does."""
    read = (
        "import { Party } from './src/index.js';"
        "const p = Party.load(process.argv[1]);"
        "console.log(JSON.stringify({ signing: p.signingKey, sealing: p.sealingKey,"
        " v: p.keyVersion, previous: p.previous.map((k) => [k.keyVersion, k.sealingKey]),"
        " text: p.keyFile() }));"
    )
    for party in (vector_party(), Party.generate("py-made")):
        path = tmp_path / f"{party.account_id}.key"
        party.save(path)
        got = json.loads(_node(read, str(path)))
        assert got["text"] == path.read_text()
        assert (got["signing"], got["sealing"], got["v"]) == (
            party.public_key,
            party.sealing_public_key,
            party.key_version,
        )
        assert got["previous"] == [[k.version, k.public_key] for k in party.previous]
    node_made = tmp_path / "node-made.key"
    assert NODE is not None
    r = subprocess.run(
        [NODE, "bin/emarket.js", "keygen", "--account", "nora", "--out", str(node_made)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=NODE_DIR,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert node_made.stat().st_mode & 0o777 == 0o600
    nora = Party.load(node_made)
    assert nora.key_file() == node_made.read_text()
    doc = json.loads(node_made.read_text())
    assert base64.b64decode(doc["signing_private_key"]) == nora.signing_key.private_bytes_raw()
    node_made.chmod(0o640)
    r = subprocess.run(
        [NODE, "--input-type=module", "-e", read, str(node_made)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=NODE_DIR,
        check=False,
    )
    assert r.returncode == 0 and f"chmod 600 {node_made}" in r.stderr
