"""Running workers: in this process (``serve``/``worker``) or as child processes (demo, tests).

Child workers run ``python -m streams worker`` in their own process group, so a test or the demo
can kill one (even with SIGKILL, to simulate a crash) and always stops exactly the processes it
started.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..broker.admin import check_input_partitions, ensure_topics, wait_for_broker
from ..core.keys import MarketKeys
from .config import Settings
from .deadline import STOP_DEADLINE_S, exit_after

__all__ = ["ChildWorker", "run_worker", "settings_args"]


def run_worker(settings: Settings, on_forced_exit: Callable[[], None] | None = None) -> None:
    """Start a Faust worker in this process and block until SIGINT/SIGTERM.

    A stop signal ends the process within :data:`STOP_DEADLINE_S` in every state;
    ``on_forced_exit`` (e.g. stopping the embedded broker of ``serve``) runs first if the
    graceful stop overran.
    """
    from .app import MarketWorker  # noqa: PLC0415
    from .faust_internals import worker_class  # noqa: PLC0415
    from .secrets import load_or_create_keys  # noqa: PLC0415

    keys = load_or_create_keys(settings.data_dir)
    asyncio.run(_prepare(settings, keys))
    worker = MarketWorker(settings, keys)
    worker.on_forced_exit = on_forced_exit
    # Everything built so far (faust, aiokafka, pydantic's schemas, numpy, scipy: ~120,000
    # objects) lives as long as the process. Left to the cyclic collector, each full collection
    # scanned them all: 40-90 ms with the event loop stopped (measured with py-spy on a worker
    # under load), every event then in flight waiting it out. Frozen, they are never scanned
    # again (a full collection takes ~10 ms); the state's own objects are still collected as
    # usual. How much of the latency tail this removed is not measured: most of the tail came
    # from aiokafka's prefetch backoff (faust_internals.prefetch_backoff) and CPU contention.
    gc.freeze()
    faust_worker = worker_class(lambda: exit_after(STOP_DEADLINE_S, on_forced_exit))
    faust_worker(
        worker.app,
        loglevel=settings.log_level,
        quiet=True,
        redirect_stdouts=False,
    ).execute_from_commandline()


async def _prepare(settings: Settings, keys: MarketKeys) -> None:
    """Wait for the broker, create the market's topics, and check the market's identity."""
    from ..core.state import Stores  # noqa: PLC0415
    from .identity import check_identity  # noqa: PLC0415
    from .progress import progress_spec  # noqa: PLC0415

    auth = settings.aiokafka_auth()
    topics = settings.topics()
    await wait_for_broker(settings.bootstrap, **auth)
    await ensure_topics(settings.bootstrap, topics, settings.replication, **auth)
    await ensure_topics(
        settings.bootstrap,
        [progress_spec(settings.app_id, settings.partitions)],
        settings.replication,
        **auth,
    )
    state = [
        progress_spec(settings.app_id, settings.partitions).name,
        *(f"{settings.app_id}-{name}-changelog" for name in Stores.NAMES),
    ]
    await check_input_partitions(settings.bootstrap, topics, state, **auth)
    await check_identity(settings.bootstrap, topics, keys, **auth)


def settings_args(s: Settings) -> list[str]:
    """CLI flags that reproduce ``s`` in a child ``python -m streams worker``."""
    args = [
        "--broker",
        s.broker,
        "--prefix",
        s.prefix,
        "worker",
        "--app-id",
        s.app_id,
        "--partitions",
        str(s.partitions),
        "--data-dir",
        str(s.data_dir),
        "--store",
        s.store,
        "--web-host",
        s.web_host,
        "--web-port",
        str(s.web_port),
        "--session-timeout",
        str(s.session_timeout),
        "--heartbeat-interval",
        str(s.heartbeat_interval),
        "--fetch-max-wait-ms",
        str(s.fetch_max_wait_ms),
        "--log-level",
        s.log_level,
    ]
    if s.tansu:
        args.append("--tansu")
    if not s.require_encryption:
        args.append("--unsafe-unsealed-buyers")
    if s.accept_clear_values:
        args.append("--accept-clear-values")
    return args


@dataclass
class ChildWorker:
    """A worker in a child process, with its own web port for /health and /metrics."""

    settings: Settings
    log_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    _log: Any = None

    @property
    def url(self) -> str:
        return f"http://{self.settings.web_host}:{self.settings.web_port}"

    def start(self) -> ChildWorker:
        out: Any = subprocess.DEVNULL
        if self.log_path is not None:
            out = self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in _signal()
        s = self.settings  # the opening rules and page intervals as settings say (no flags)
        env = {
            **os.environ,
            "EMARKET_OPENINGS": s.limits.openings,
            "EMARKET_OPENING_WORK": str(s.limits.opening_work),
            "EMARKET_LEDGER_EVERY": str(s.ledger_every),
            "EMARKET_METRICS_EVERY": str(s.metrics_every),
            "EMARKET_PAGES_PER_SECOND": str(s.pages_per_second),
            "EMARKET_INBOXES": f"v{s.inboxes}",
            "EMARKET_INBOX_PARTITIONS": str(s.inbox_partitions),
            **self.env,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streams", *settings_args(self.settings)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 5) -> str:
        """The last ``lines`` of the worker's log (what it said before it exited), or why
        there is none."""
        if self.log_path is None:
            return "(no log kept)"
        if self._log is not None:
            self._log.flush()
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(log {self.log_path}: {exc.strerror})"
        return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"

    def get(self, path: str, timeout: float = 30.0, token: str | None = None) -> Any:
        """GET a worker endpoint (JSON, or text for /metrics), with the operators' ``token`` if
        given; raises HTTPError on 4xx and 5xx.

        The timeout is long: a worker's web server shares its event loop with the batches, so a
        worker busy with a large batch on a contended CPU answers late, not never.
        """
        request = urllib.request.Request(self.url + path)
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            body = resp.read()
        return json.loads(body) if path != "/metrics" else body.decode()

    def wait_healthy(self, timeout: float = 60.0, *, ok_only: bool = True) -> None:
        """Return once ``/health`` answers ok (or, without ``ok_only``, answers at all: a
        worker that reports a problem answers 503)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(
                    f"worker exited with status {self.proc and self.proc.returncode}: "
                    f"{self.log_tail()}"
                )
            try:
                self.get("/health", timeout=max(1.0, min(10.0, deadline - time.monotonic())))
                return
            except urllib.error.HTTPError:
                if not ok_only:
                    return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"worker on {self.url} not healthy within {timeout}s")

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Sum of samples of ``name`` (matching ``labels``) scraped from /metrics."""
        from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

        total = 0.0
        for fam in text_string_to_metric_families(self.get("/metrics")):
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in (labels or {}).items()):
                    total += s.value
        return total

    def stop(self, timeout: float = 15.0) -> int | None:
        """Graceful stop (SIGTERM to the worker's process group), SIGKILL after ``timeout``."""
        return self._signal(signal.SIGTERM, timeout)

    def kill(self) -> int | None:
        """Crash the worker: SIGKILL, no cleanup, no commit."""
        return self._signal(signal.SIGKILL, 10.0)

    def _signal(self, sig: int, timeout: float) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout)
        if self._log is not None:
            self._log.close()
            self._log = None
        return proc.returncode
