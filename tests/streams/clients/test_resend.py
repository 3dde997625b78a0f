"""A purchase sent again by a new process is told the outcome of that purchase, not the answer
to another request that used its id (docs/protocol.md §12.4): the CLI run as a person runs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..conftest import Market
from ..helpers import cli_parties
from .test_first_hour import assert_clean, cli

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_a_resend_after_the_id_was_reused_reports_its_own_purchase(
    market: Market, tmp_path: Path
) -> None:
    market.start_worker()
    pre = ["--broker", market.broker.url, "--prefix", market.topics.prefix]
    acme, bob = cli_parties(cli, pre, tmp_path, "acme", "bob").values()
    r = cli(*pre, "register", *acme, "--stream", "temp", "--dimension", "2", "--steps", "1,2")
    assert r.returncode == 0, r.stderr
    assert_clean(cli(*pre, "publish", *acme, "--stream", "temp", "--values", "1,2"), 0)
    buy = [*pre, "buy", *bob, "--stream", "temp", "--purchase-id", "cid-1"]
    first = cli(*buy, "--max-price", "1", "--json")
    assert_clean(first, 0)
    # the id used again with other terms is refused, bound to those bytes
    assert_clean(cli(*buy, "--max-price", "2"), 1, "idempotency_key_reused")
    # the first purchase sent again (a new process: signed anew) within the market's 10 s
    again = cli(*buy, "--max-price", "1", "--json")
    assert_clean(again, 0)
    assert "idempotency_key_reused" not in again.stdout + again.stderr
    got, want = json.loads(again.stdout), json.loads(first.stdout)
    assert got["receipt"] == want["receipt"]
