"""Openings on a live worker (issue #40): by invitation, the operators' `invite` and a party's
`account open --invitation`; in an open market with proof of work, the client's own work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streams.clients.client import MarketClient
from streams.core.context import Limits
from streams.wire.events import AccountState

from ..clients.test_cli import cli
from ..conftest import Market
from ..helpers import party

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_an_invite_only_market_opens_an_account_with_the_operators_invitation(
    market: Market, tmp_path: Path
) -> None:
    market.start_worker(limits=Limits(openings="invite"))
    key = tmp_path / "alice.key"
    signing = json.loads(
        cli(None, "keygen", "--account", "alice", "--out", str(key), "--json").stdout
    )["signing_key"]
    r = cli(market, "account", "open", "--key-file", str(key), check=False)
    assert r.returncode == 1 and "invitation_required" in r.stderr, r.stderr
    other = tmp_path / "bob.invitation"  # an invitation for someone else opens nothing
    cli(
        market,
        "invite",
        "--account",
        "bob",
        "--data-dir",
        str(market.settings.data_dir),
        "--out",
        str(other),
    )
    r = cli(
        market, "account", "open", "--key-file", str(key), "--invitation", str(other), check=False
    )
    assert r.returncode == 1 and "bad_invitation" in r.stderr, r.stderr
    mine = tmp_path / "alice.invitation"
    r = cli(
        market,
        "invite",
        "--account",
        "alice",
        "--signing-key",
        signing,
        "--data-dir",
        str(market.settings.data_dir),
        "--out",
        str(mine),
    )
    assert "valid until" in r.stdout
    r = cli(market, "account", "open", "--key-file", str(key), "--invitation", str(mine))
    assert "is open" in r.stdout


def test_the_client_does_the_work_an_open_market_asks(market: Market) -> None:
    market.start_worker(limits=Limits(opening_work=8))

    async def go(c: MarketClient) -> object:
        return await c.open_account(party("alice"), timeout=60)

    got = market.run(go)
    assert isinstance(got, AccountState) and got.account_id == "alice"
