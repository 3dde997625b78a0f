"""How a client batches a seller's values by default, apart from the batcher itself
(:mod:`streams.clients.batching`), so that the command line can state the defaults without
importing the wire models (``verify-receipt`` runs with the base package alone)."""

DEFAULT_MAX_VALUES = 32
"""Values per batch by default: where the market's CPU per value stops falling (measured with
``bench.core``: 0.33 of one value's cost at 16 a batch, 0.31 at 32, about the same beyond)."""
DEFAULT_MAX_DELAY = 0.05
"""Seconds a value waits by default for others to share its batch (50 ms)."""
