"""Settings, Kafka credentials and the market's secrets."""

from __future__ import annotations

import base64
import os
import stat
from dataclasses import fields
from pathlib import Path

import pytest

from streams.broker.auth import kafka_auth
from streams.clients.cli import build_parser
from streams.clients.commands.operator import _tuned
from streams.core.context import Limits
from streams.core.keys import MarketKeys
from streams.wire.work import DEFAULT_BITS
from streams.worker.config import Settings
from streams.worker.secrets import load_or_create_keys


def test_kafka_auth() -> None:
    assert kafka_auth(None, None) == {}
    auth = kafka_auth("worker", "pw")
    assert auth["security_protocol"] == "SASL_PLAINTEXT"
    assert auth["sasl_mechanism"] == "SCRAM-SHA-512"
    with pytest.raises(ValueError, match="password"):
        kafka_auth("worker", None)


def test_settings_from_env_and_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMARKET_KAFKA_USER", "market-worker")
    monkeypatch.setenv("EMARKET_KAFKA_PASSWORD", "secret-pw")
    monkeypatch.setenv("EMARKET_PARTITIONS", "8")
    s = Settings.from_env(prefix="x")
    assert s.partitions == 8 and s.prefix == "x"
    creds = s.faust_credentials()
    assert creds.username == "market-worker"
    assert "secret-pw" not in repr(s)
    tansu = s.for_tansu()
    assert tansu.tansu and tansu.fetch_max_wait_ms == 20 and tansu.session_timeout <= 3


def test_the_embedded_brokers_tuning_yields_to_the_environment_and_the_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``serve`` on the embedded broker used to apply its short fetch wait after the flags and
    the environment, so ``--fetch-max-wait-ms`` and ``EMARKET_FETCH_MAX_WAIT_MS`` did nothing."""
    monkeypatch.delenv("EMARKET_FETCH_MAX_WAIT_MS", raising=False)
    assert Settings().for_tansu().fetch_max_wait_ms == 20
    monkeypatch.setenv("EMARKET_FETCH_MAX_WAIT_MS", "80")
    monkeypatch.setenv("EMARKET_SESSION_TIMEOUT", "4.5")
    tansu = Settings().for_tansu()
    assert (tansu.fetch_max_wait_ms, tansu.session_timeout, tansu.heartbeat_interval) == (
        80,
        4.5,
        0.3,
    )
    args = build_parser().parse_args(["serve", "--fetch-max-wait-ms", "120"])
    assert _tuned(tansu, args).fetch_max_wait_ms == 120


def test_every_bound_of_the_core_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Settings carry the core's one ``Limits``: each whole-number bound from ``EMARKET_`` and
    its name in capitals, the openings rule from ``EMARKET_OPENINGS``."""
    defaults = Limits()
    whole = [f.name for f in fields(Limits) if type(getattr(defaults, f.name)) is int]
    assert {"max_holders", "max_message_bytes", "max_event_work", "opening_work"} <= set(whole)
    for i, name in enumerate(whole):
        monkeypatch.setenv(f"EMARKET_{name.upper()}", str(1000 + i))
    monkeypatch.setenv("EMARKET_OPENINGS", "invite")
    limits = Settings.from_env().limits
    assert [getattr(limits, name) for name in whole] == [1000 + i for i in range(len(whole))]
    assert limits.openings == "invite"
    assert limits.record_caps == defaults.record_caps and limits.refusals == defaults.refusals
    monkeypatch.delenv("EMARKET_OPENING_WORK")
    assert Settings.from_env().limits.opening_work == DEFAULT_BITS  # a deployment asks work
    assert Settings().limits == defaults  # settings made in code: the core's defaults
    monkeypatch.setenv("EMARKET_OPENINGS", "closed")
    with pytest.raises(ValueError, match="EMARKET_OPENINGS must be 'invite' or 'open'"):
        Settings.from_env()


def test_keys_are_created_private_and_stable(tmp_path: Path) -> None:
    keys = load_or_create_keys(tmp_path / "d", env={})
    for f in ("signing_key.pem", "noise_secret.bin"):
        mode = stat.S_IMODE(os.stat(tmp_path / "d" / f).st_mode)
        assert mode == 0o600, oct(mode)
    assert stat.S_IMODE(os.stat(tmp_path / "d").st_mode) == 0o700
    again = load_or_create_keys(tmp_path / "d", env={})
    assert again.key_id == keys.key_id and again.noise_secret == keys.noise_secret
    assert "redacted" in repr(keys) and keys.noise_secret.hex() not in repr(keys)


def test_keys_from_environment(tmp_path: Path) -> None:
    raw = bytes(range(32))
    env = {
        "EMARKET_SIGNING_KEY": base64.b64encode(raw).decode(),
        "EMARKET_NOISE_SECRET": base64.b64encode(b"s" * 32).decode(),
    }
    keys = load_or_create_keys(None, env=env)
    assert isinstance(keys, MarketKeys) and keys.noise_secret == b"s" * 32
    with pytest.raises(ValueError, match="EMARKET_SIGNING_KEY"):
        load_or_create_keys(None, env={**env, "EMARKET_SIGNING_KEY": "not base64!"})
    with pytest.raises(ValueError, match="at least 16"):
        load_or_create_keys(
            None, env={**env, "EMARKET_NOISE_SECRET": base64.b64encode(b"x").decode()}
        )
