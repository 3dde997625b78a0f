"""``publish --file`` stopped by Ctrl-C: finish the batch in flight, say where it stopped, and
the exact command that resumes it.

A value read from a file without a ``value_id`` gets a new id (and publication time) each time
it is sent, so sending such a value again publishes it twice; only the values of a file the
market has not received may be sent again. The first Ctrl-C therefore lets the batch in flight
finish (sent and answered: at most one batch, ``--timeout`` at most), stops before the next, and
prints how many values the market has answered and ``--skip N``, which resumes after them. A
second Ctrl-C stops at once; the batch then in flight may or may not have reached the market,
and the message says so, with what tells which (``tail`` shows the answers in the inbox).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import signal
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Run", "resume_command"]

T = TypeVar("T")


@dataclass
class Run:
    """Where a ``publish --file`` is: values skipped (``--skip``), answered, in flight."""

    total: int
    skipped: int = 0
    answered: int = 0
    in_flight: int = 0
    stopped: bool = False

    async def send(self, values: int, sending: Awaitable[T]) -> T:
        """Await ``sending`` (a batch of ``values``), finishing it even if Ctrl-C comes
        meanwhile (then :attr:`stopped` is set: the caller sends no further batch)."""
        task = asyncio.ensure_future(sending)
        self.in_flight = values
        try:
            got = await asyncio.shield(task)
        except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels the command's task
            self.stopped = True
            _again_cancels(task)
            got = await task
        self.in_flight = 0
        self.answered += values
        return got

    def report(self, args: argparse.Namespace) -> list[str]:
        """The lines a person reads once Ctrl-C stopped the command."""
        done = self.skipped + self.answered
        answered = "sent" if args.no_wait else "sent and answered by the market"
        lines = [
            f"stopped by Ctrl-C: {done} of {self.total} values of {args.file} {answered}"
            + (f" ({self.skipped} skipped with --skip)" if self.skipped else "")
        ]
        if self.in_flight:
            first = done + 1
            lines.append(
                f"values {first}-{done + self.in_flight} were being sent: the market may have "
                "them (`epsilon-market tail` shows its answers). Resending a value with its "
                "value_id and published_at_ms is harmless; one without would be published "
                f"twice: resume with --skip {done + self.in_flight} if tail shows them accepted"
            )
        if done < self.total:
            lines.append(f"resume with: {resume_command(args, done)}")
        return lines


def _again_cancels(task: asyncio.Future[T]) -> None:
    """A second Ctrl-C cancels ``task`` (the batch being finished), so the command stops as it
    does at a first one; asyncio's own second-Ctrl-C handler would raise inside the task and
    leave its exception to be logged with a traceback."""
    with contextlib.suppress(NotImplementedError, RuntimeError):  # no signals here: as before
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, task.cancel)


def resume_command(args: argparse.Namespace, skip: int) -> str:
    """The command that publishes the rest of ``--file``, after its first ``skip`` values."""
    head = ["epsilon-market"]
    if args.broker and args.broker != os.environ.get("EMARKET_BROKER"):
        head += ["--broker", args.broker]
    if args.prefix != os.environ.get("EMARKET_PREFIX", "emarket"):
        head += ["--prefix", args.prefix]
    if args.market_key and args.market_key != os.environ.get("EMARKET_MARKET_KEY"):
        head += ["--market-key", args.market_key]
    cmd = ["publish", "--stream", args.stream, "--file", args.file]
    if args.key_file != os.environ.get("EMARKET_KEY_FILE"):
        cmd[1:1] = ["--key-file", args.key_file]
    if args.market_sealing_key:
        cmd += ["--market-sealing-key", args.market_sealing_key]
    if args.no_wait:
        cmd.append("--no-wait")
    if args.timeout != 60.0:
        cmd += ["--timeout", f"{args.timeout:g}"]
    if getattr(args, "json", False):
        cmd.append("--json")
    return shlex.join([*head, *cmd, "--skip", str(skip)])
