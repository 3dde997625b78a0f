"""A deadline on stopping: a worker asked to stop, or stopping after a crash, is gone in time.

A graceful stop can wait on a broker that does not answer (a final commit, a producer flush),
on an event that never completes, or on Faust's consumer waiting for records a crashed batch
never acknowledged (seen: a crashed worker hung in ``Consumer: Stopping...`` for a minute).
Exiting without them is safe: nothing is committed that was not processed, and replays are
harmless (``docs/architecture.md``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable

__all__ = ["STOP_DEADLINE_S", "exit_after"]

#: a worker asked to stop is gone this many seconds later, whatever it was doing
STOP_DEADLINE_S = 8.0


def exit_after(seconds: float, cleanup: Callable[[], None] | None = None) -> None:
    """Exit the process with status 1 ``seconds`` from now unless it has exited by then.

    Parameters
    ----------
    seconds : float
        The time the graceful stop is given.
    cleanup : callable, optional
        Run before the forced exit (``serve`` stops its embedded broker here).
    """

    def deadline() -> None:
        time.sleep(seconds)
        logging.getLogger(__name__).error(
            "graceful stop did not finish in %.0fs: exiting now", seconds
        )
        if cleanup is not None:
            with contextlib.suppress(Exception):
                cleanup()
        logging.shutdown()
        os._exit(1)

    threading.Thread(target=deadline, name="stop-deadline", daemon=True).start()
