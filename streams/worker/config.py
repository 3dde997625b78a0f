"""Worker settings: one frozen object, filled from CLI flags and ``EMARKET_*`` variables."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from ..broker.auth import kafka_auth
from ..core.context import Limits
from ..wire.topics import DEDUP_HORIZON_MS, Topics
from ..wire.work import DEFAULT_BITS as DEFAULT_WORK_BITS

__all__ = ["Settings"]


def _truthy(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


def _env(name: str, default: Any, cast: Any = str) -> Any:
    raw = os.environ.get(f"EMARKET_{name}")
    if raw is None or raw == "":
        return default
    if cast not in (int, float):
        return cast(raw)  # its own checks name the variable
    try:
        return cast(raw)
    except ValueError:  # named, for the one line a person reads
        kind = "whole number" if cast is int else "number"
        raise ValueError(f"EMARKET_{name}={raw!r} is not a {kind}") from None


def _openings(text: str) -> Literal["invite", "open"]:
    """``EMARKET_OPENINGS``: ``invite`` or ``open``."""
    if text not in ("invite", "open"):
        raise ValueError(f"EMARKET_OPENINGS must be 'invite' or 'open', not {text!r}")
    return "invite" if text == "invite" else "open"


def _inboxes(text: str) -> int:
    """``EMARKET_INBOXES``: ``v1`` (a topic per account) or ``v2`` (one partitioned topic)."""
    if text not in ("v1", "v2"):
        raise ValueError(f"EMARKET_INBOXES must be 'v1' or 'v2', not {text!r}")
    return 2 if text == "v2" else 1


def _limits_from_env() -> Limits:
    """The core's bounds as the operators set them: each whole-number bound from ``EMARKET_``
    and its name in capitals (``max_holders``: ``EMARKET_MAX_HOLDERS``), the openings rule
    from ``EMARKET_OPENINGS``. The names are :class:`Limits`' own, so a bound added there is
    settable here without a second list of them to keep in step."""
    defaults = Limits()
    whole = {
        f.name: _env(f.name.upper(), getattr(defaults, f.name), int)
        for f in fields(Limits)
        if type(getattr(defaults, f.name)) is int
    }
    # a deployment asks proof of work of an opening unless told otherwise
    whole["opening_work"] = _env("OPENING_WORK", DEFAULT_WORK_BITS, int)
    return replace(defaults, **whole, openings=_openings(_env("OPENINGS", defaults.openings)))


TANSU_SESSION_TIMEOUT = 3.0
"""Seconds: the embedded broker holds a JoinGroup for half the session timeout."""
TANSU_HEARTBEAT_INTERVAL = 0.3
TANSU_FETCH_MAX_WAIT_MS = 20
"""The embedded broker answers a fetch only when its wait ends, even when records arrive: the
wait is each hop's latency, and each waiting consumer's cost while idle."""


@dataclass(frozen=True)
class Settings:
    """Everything a worker needs. Defaults suit the embedded broker; see docs/operations.md."""

    broker: str = "kafka://127.0.0.1:9092"
    #: True when the broker is the embedded Tansu: installs its workarounds
    #: (:func:`streams.worker.faust_internals.install_tansu_compat`).
    tansu: bool = False
    app_id: str = "epsilon-market"
    prefix: str = "emarket"
    partitions: int = 4
    replication: int = 1
    data_dir: Path = field(default_factory=lambda: Path("data"))
    store: str = "memory://"
    web_host: str = "127.0.0.1"
    web_port: int = 6066
    #: Consumer group session timeout. Tansu holds a join for half of it, so keep it short there.
    session_timeout: float = 10.0
    heartbeat_interval: float = 1.0
    #: Faust hard-codes 1500 ms; Tansu never wakes a waiting fetch, so we lower it there.
    fetch_max_wait_ms: int = 1500
    #: Most events applied before state is flushed; fewer when no more events are waiting.
    batch_max: int = 200
    commit_interval: float = 1.0
    log_level: str = "info"
    #: SASL credentials for Apache Kafka (the embedded broker has no authentication).
    kafka_user: str | None = field(default=None, repr=False)
    kafka_password: str | None = field(default=None, repr=False)
    kafka_mechanism: str = "SCRAM-SHA-512"
    kafka_security: str = "SASL_PLAINTEXT"
    #: CA file that signed the broker's certificate (``SASL_SSL``; default: system authorities).
    kafka_ca: str | None = None
    #: Refuse purchases from accounts without a sealing key, so every release is sealed.
    #: Turning it off (``--unsafe-unsealed-buyers``) lets anyone who reads a buyer's inbox
    #: topic read its releases; on the embedded broker that is anyone.
    require_encryption: bool = True
    #: Also accept value batches whose numbers are not sealed to the market's key (refused as
    #: ``values_not_sealed`` otherwise): only while sellers' clients are upgraded, since
    #: anyone who reads the values topic reads clear numbers.
    accept_clear_values: bool = False
    #: Seconds a value or purchase is remembered for deduplication; older ones are refused.
    #: Match the values topic's retention (see :data:`streams.wire.topics.DEDUP_HORIZON_MS`).
    dedup_horizon: float = DEDUP_HORIZON_MS / 1000
    #: Log, per batch part, how long its oldest event waited since it was produced, and the
    #: time spent processing, persisting state and sending outputs.
    profile_batches: bool = False
    #: The core's bounds (:class:`~streams.core.context.Limits`, where each is explained), from
    #: ``EMARKET_MAX_*``, ``EMARKET_OPENINGS`` and ``EMARKET_OPENING_WORK``. In an open market
    #: ``serve`` and ``worker`` (settings from the environment) ask ``DEFAULT_WORK_BITS`` of
    #: proof of work an opening unless told otherwise; settings made in code (benchmarks,
    #: tests) ask none unless they say so.
    limits: Limits = field(default_factory=Limits)
    #: Inbox topics created by one CreateTopics request, off the event path (worker.inboxes).
    inbox_batch: int = 100
    #: 1: an inbox topic per account; 2: one partitioned topic ``<p>.inbox`` of
    #: ``inbox_partitions`` (docs/protocol.md §8.5). Fixed when the market is made: its
    #: identity records them and a worker with other settings refuses to start.
    inboxes: int = 1
    inbox_partitions: int = 16
    #: /health answers 503 when input is waiting and no batch completed for this many seconds.
    stall_seconds: float = 30.0
    #: Seconds a build of ``/ledger`` (of ``/metrics``) serves the requests that arrive after
    #: it began: at most one build per interval, however many requests (0: a build per request,
    #: shared by concurrent ones). Below Prometheus' scrape interval (15 s), so that each scrape
    #: gets a new build.
    ledger_every: float = 5.0
    metrics_every: float = 5.0
    #: Most answers a second of each of ``/ledger`` and ``/metrics``; more requests wait their
    #: turn, so that clients looping on a page mostly wait (0: no pacing).
    pages_per_second: float = 10.0
    #: Sends refused for a permanent reason (too large, not authorised, no such topic) are
    #: retried this many times, then dead-lettered; a broker outage is waited out.
    permanent_retries: int = 3

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        s = cls(
            broker=_env("BROKER", cls.broker),
            app_id=_env("APP_ID", cls.app_id),
            prefix=_env("PREFIX", cls.prefix),
            partitions=_env("PARTITIONS", cls.partitions, int),
            replication=_env("REPLICATION", cls.replication, int),
            data_dir=Path(_env("DATA_DIR", "data")),
            store=_env("STORE", cls.store),
            web_host=_env("WEB_HOST", cls.web_host),
            web_port=_env("WEB_PORT", cls.web_port, int),
            session_timeout=_env("SESSION_TIMEOUT", cls.session_timeout, float),
            heartbeat_interval=_env("HEARTBEAT_INTERVAL", cls.heartbeat_interval, float),
            fetch_max_wait_ms=_env("FETCH_MAX_WAIT_MS", cls.fetch_max_wait_ms, int),
            log_level=_env("LOG_LEVEL", cls.log_level),
            batch_max=_env("BATCH_MAX", cls.batch_max, int),
            kafka_user=_env("KAFKA_USER", None),
            kafka_password=_env("KAFKA_PASSWORD", None),
            kafka_mechanism=_env("KAFKA_MECHANISM", cls.kafka_mechanism),
            kafka_security=_env("KAFKA_SECURITY", cls.kafka_security),
            kafka_ca=_env("KAFKA_CA", None),
            require_encryption=_env("REQUIRE_ENCRYPTION", True, _truthy),
            accept_clear_values=_env("ACCEPT_CLEAR_VALUES", False, _truthy),
            dedup_horizon=_env("DEDUP_HORIZON", cls.dedup_horizon, float),
            profile_batches=_env("PROFILE_BATCHES", False, _truthy),
            inbox_batch=_env("INBOX_BATCH", cls.inbox_batch, int),
            inboxes=_env("INBOXES", cls.inboxes, _inboxes),
            inbox_partitions=_env("INBOX_PARTITIONS", cls.inbox_partitions, int),
            stall_seconds=_env("STALL_SECONDS", cls.stall_seconds, float),
            ledger_every=_env("LEDGER_EVERY", cls.ledger_every, float),
            metrics_every=_env("METRICS_EVERY", cls.metrics_every, float),
            pages_per_second=_env("PAGES_PER_SECOND", cls.pages_per_second, float),
            permanent_retries=_env("PERMANENT_RETRIES", cls.permanent_retries, int),
            limits=_limits_from_env(),
        )
        return replace(s, **{k: v for k, v in overrides.items() if v is not None})

    def topics(self) -> Topics:
        """The market's topic layout as these settings make it."""
        return Topics(self.prefix, self.partitions, self.inboxes, self.inbox_partitions)

    def for_tansu(self) -> Settings:
        """Short group timeouts and fetch waits that make the embedded broker responsive.

        Tansu holds a join for half the session timeout and never wakes a waiting fetch, so
        its defaults differ from Kafka's; an ``EMARKET_SESSION_TIMEOUT``,
        ``EMARKET_HEARTBEAT_INTERVAL`` or ``EMARKET_FETCH_MAX_WAIT_MS`` that is set still wins
        (a command's flags are applied after this)."""
        return replace(
            self,
            tansu=True,
            session_timeout=_env("SESSION_TIMEOUT", TANSU_SESSION_TIMEOUT, float),
            heartbeat_interval=_env("HEARTBEAT_INTERVAL", TANSU_HEARTBEAT_INTERVAL, float),
            fetch_max_wait_ms=_env("FETCH_MAX_WAIT_MS", TANSU_FETCH_MAX_WAIT_MS, int),
        )

    def aiokafka_auth(self) -> dict[str, Any]:
        """Keyword arguments that authenticate an aiokafka client (empty without a user)."""
        return kafka_auth(
            self.kafka_user,
            self.kafka_password,
            self.kafka_mechanism,
            self.kafka_security,
            self.kafka_ca,
        )

    def faust_credentials(self) -> Any:
        if not self.kafka_user:
            return None
        import faust  # noqa: PLC0415

        return faust.SASLCredentials(
            username=self.kafka_user,
            password=self.kafka_password,
            mechanism=self.kafka_mechanism,
            ssl_context=self.aiokafka_auth().get("ssl_context"),
        )

    @property
    def bootstrap(self) -> str:
        return ",".join(u.split("://", 1)[-1] for u in self.broker.split(";"))
