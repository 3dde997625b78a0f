"""Loading the market's secrets: the Ed25519 receipt-signing key and the noise secret.

Both are generated on first start into the data directory (files created with mode 0600 inside a
0700 directory) or loaded from the environment for deployments:

* ``EMARKET_SIGNING_KEY``: the Ed25519 private key, base64 of the raw 32 bytes, or a path to a
  PEM/raw file;
* ``EMARKET_NOISE_SECRET``: base64 of at least 16 random bytes, or a path to a file holding them.

Secrets are never logged: :class:`MarketKeys` has a redacting ``repr``. The noise secret is as
sensitive as the exact values (with it and the stored state, noise can be recomputed); the
signing key lets whoever holds it forge receipts.

The key that authenticates the market's state records (:mod:`streams.worker.state_records`) is not
a third secret to keep: it is derived from the noise secret (:func:`state_keys`), which every
worker of a market must share already (:mod:`streams.worker.identity` checks it). The operators'
credential for per-buyer pages (:attr:`MarketKeys.operator_token`) is written beside the keys,
to ``operator_token`` in the data directory (mode 0600), where ``epsilon-market ledger`` reads it.
"""

from __future__ import annotations

import base64
import hmac
import os
import secrets
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from ..core.keys import MarketKeys

__all__ = [
    "MEMBERSHIP_LABEL",
    "OPERATOR_TOKEN_FILE",
    "STATE_DIGEST_LABEL",
    "STATE_SEAL_LABEL",
    "load_or_create_keys",
    "membership_key",
    "state_keys",
    "write_operator_token",
]

SIGNING_FILE = "signing_key.pem"
NOISE_FILE = "noise_secret.bin"
OPERATOR_TOKEN_FILE = "operator_token"

STATE_SEAL_LABEL = b"emarket state seal key v2"
"""What the noise secret MACs to give the key that seals state records (``docs/protocol.md``
§3.2): a label no other derivation from the secret uses (the fingerprint's, the sealing keys'
and the nonces' labels all differ from it and none is a prefix of another)."""
STATE_DIGEST_LABEL = b"emarket state digest key v2"
"""The same for the key of the partitions' digests (``docs/protocol.md`` §3.4)."""


def state_keys(noise_secret: bytes) -> tuple[bytes, bytes]:
    """The keys of the market's state records: ``(seal key, digest key)``, each
    ``HMAC-SHA256(noise_secret, label)``.

    Keys of their own (domain separation) rather than the noise secret itself, so that what
    anyone can read on the changelogs (sealed records, their tags, checkpoints' digest sums) is
    never an output of a function that also gives noise, sealing keys or nonces.
    """
    return (
        hmac.new(noise_secret, STATE_SEAL_LABEL, "sha256").digest(),
        hmac.new(noise_secret, STATE_DIGEST_LABEL, "sha256").digest(),
    )


MEMBERSHIP_LABEL = b"emarket membership key v1"
"""What the noise secret MACs to give the key of the workers' group-membership proofs
(``docs/protocol.md`` §13.1): a label of its own, no other derivation's prefix."""


def membership_key(noise_secret: bytes) -> bytes:
    """The key workers prove their group membership under:
    ``HMAC-SHA256(noise_secret, MEMBERSHIP_LABEL)``.

    A key of its own, not the state key: membership proofs travel in the consumer group's
    metadata, which every member of the group (and on Kafka whoever may describe the group)
    reads, and a tag there must never be a valid tag of a state record, nor the other way
    round. Like the state key it is derived, not kept: every worker of a market shares the
    noise secret already, and a worker that cannot derive it cannot prove it belongs.
    """
    return hmac.new(noise_secret, MEMBERSHIP_LABEL, "sha256").digest()


def _write_secret(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _read_material(value: str) -> bytes:
    """An env value is either a path to a file or base64 text."""
    path = Path(value)
    if len(value) < 4096 and path.is_file():
        return path.read_bytes()
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise ValueError("expected base64 or a path to an existing file") from None


def _load_signing(data: bytes) -> Ed25519PrivateKey:
    if data.lstrip().startswith(b"-----BEGIN"):
        key = load_pem_private_key(data, password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("the signing key must be an Ed25519 key")
        return key
    if len(data) != 32:
        raise ValueError("a raw Ed25519 private key is 32 bytes")
    return Ed25519PrivateKey.from_private_bytes(data)


def load_or_create_keys(data_dir: Path | None, env: dict[str, str] | None = None) -> MarketKeys:
    """Keys from the environment if set, else from ``data_dir`` (created on first start).

    The operators' token is written to ``data_dir`` only when the noise secret lives there: a
    deployment that passes its secrets in the environment keeps nothing on disk, and its
    operators pass the token the same way (``EMARKET_OPERATOR_TOKEN``).
    """
    env = dict(os.environ) if env is None else env
    signing: Ed25519PrivateKey | None = None
    noise: bytes | None = None
    if env.get("EMARKET_SIGNING_KEY"):
        try:
            signing = _load_signing(_read_material(env["EMARKET_SIGNING_KEY"]))
        except ValueError as exc:
            raise ValueError(f"EMARKET_SIGNING_KEY is not usable: {exc}") from None
    if env.get("EMARKET_NOISE_SECRET"):
        try:
            noise = _read_material(env["EMARKET_NOISE_SECRET"])
        except ValueError as exc:
            raise ValueError(f"EMARKET_NOISE_SECRET is not usable: {exc}") from None
    if signing is None or noise is None:
        if data_dir is None:
            raise ValueError("no data directory and no keys in the environment")
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        sk_path, ns_path = data_dir / SIGNING_FILE, data_dir / NOISE_FILE
        if signing is None:
            if not sk_path.exists():
                pem = Ed25519PrivateKey.generate().private_bytes(
                    Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
                )
                _write_secret(sk_path, pem)
            signing = _load_signing(sk_path.read_bytes())
        if noise is None:
            if not ns_path.exists():
                _write_secret(ns_path, secrets.token_bytes(32))
            noise = ns_path.read_bytes()
    if len(noise) < 16:
        raise ValueError("the noise secret must be at least 16 bytes")
    keys = MarketKeys(signing_key=signing, noise_secret=noise)
    if data_dir is not None and (data_dir / NOISE_FILE).exists():
        write_operator_token(data_dir, keys)  # beside the secret it is derived from
    return keys


def write_operator_token(data_dir: Path, keys: MarketKeys) -> Path:
    """Write ``keys``' operator token to ``data_dir`` (mode 0600), replacing another one.

    The file is only a copy for the CLI on this machine: the worker derives the token itself.
    """
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = data_dir / OPERATOR_TOKEN_FILE
    token = keys.operator_token.encode("ascii")
    if path.exists() and path.read_bytes() == token:
        return path
    fresh = path.with_name(f".{OPERATOR_TOKEN_FILE}.{os.getpid()}")
    fresh.unlink(missing_ok=True)
    _write_secret(fresh, token)
    os.replace(fresh, path)
    return path
