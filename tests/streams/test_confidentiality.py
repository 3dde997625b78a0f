"""What the market shows to whoever can reach it: no per-buyer data without the operators'
credential, every buyer sealed unless an operator says otherwise."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from streams.clients.cli import build_parser
from streams.clients.commands.operator import _worker_settings
from streams.core import Stores
from streams.worker import web
from streams.worker.runner import settings_args
from streams.worker.secrets import OPERATOR_TOKEN_FILE, load_or_create_keys

from .helpers import TEST_KEYS, market_core, purchase, registration, value


def _core_with_a_buyer() -> Stores:
    core = market_core("seller1", "alice")
    t = core.ctx.topics
    assert core.handle(t.registrations, registration("temp")).status == "accepted"
    assert core.handle(t.values, value("temp", "v1", [1.0, 2.0, 3.0])).status == "accepted"
    assert core.handle(t.purchases, purchase("temp", "alice", "p1")).status == "fulfilled"
    return core.stores


def test_the_ledger_names_no_buyer_without_the_operators_token() -> None:
    stores = _core_with_a_buyer()
    public = web.ledger(stores, TEST_KEYS)
    assert "alice" not in json.dumps(public)
    assert public["streams"]["temp"]["holder_count"] == 1 and not public["per_buyer"]
    detail = web.ledger(stores, TEST_KEYS, per_buyer=True)
    assert detail["streams"]["temp"]["holders"]["alice"]["purchases"] == 1


def test_only_the_operators_bearer_token_opens_the_detail() -> None:
    token = TEST_KEYS.operator_token
    assert web.ledger_access(None, TEST_KEYS) is False
    assert web.ledger_access("", TEST_KEYS) is False
    assert web.ledger_access(f"Bearer {token}", TEST_KEYS) is True
    assert web.ledger_access(f"bearer {token}", TEST_KEYS) is True
    for wrong in (f"Bearer {token[:-1]}", f"Basic {token}", "Bearer", "Bearer é"):
        assert web.ledger_access(wrong, TEST_KEYS) is None, wrong


def test_the_token_is_written_beside_the_keys_for_the_operators_only(tmp_path: Path) -> None:
    keys = load_or_create_keys(tmp_path / "data", env={})
    path = tmp_path / "data" / OPERATOR_TOKEN_FILE
    assert path.read_text() == keys.operator_token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_or_create_keys(tmp_path / "data", env={})
    assert again.operator_token == keys.operator_token  # one token per market (its secret)
    assert keys.operator_token not in repr(keys)


def test_serve_and_worker_seal_every_buyer_unless_told_it_is_unsafe() -> None:
    parser = build_parser()
    for command in ("serve", "worker"):
        safe = _worker_settings(parser.parse_args([command]))
        assert safe.require_encryption
        assert "--unsafe-unsealed-buyers" not in settings_args(safe)
        unsafe = _worker_settings(parser.parse_args([command, "--unsafe-unsealed-buyers"]))
        assert not unsafe.require_encryption
        child = _worker_settings(parser.parse_args(settings_args(unsafe)))
        assert not child.require_encryption  # a child worker keeps the operator's choice
