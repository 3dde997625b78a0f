"""The market's logic over events, without Kafka: one module per step of the event path.

==================  ==============================================================
``router``          :class:`MarketCore`: one event in → its handler; errors → rejections
``registrations``   a seller's registration → stream state and catalog entry
``values``          a value → its release state, the window, eviction
``delivery``        subscription deliveries, batched per buyer and stream
``purchases``       a purchase → plan, release, charge, receipt; quotes
``rejections``      a refused event → a ``Rejection`` its sender can act on
``horizon``         the dedup horizon shared by values and purchases
``state``           the stored records and their stores; ``codecs`` their bytes
``context``         what the handlers share; ``outputs`` what they return
``keys``            the market's signing key and noise secret
==================  ==============================================================

Nothing here imports Faust, aiokafka or the broker: the worker (:mod:`streams.worker`) feeds
events in and sends the outputs.
"""

from .keys import MarketKeys
from .outputs import Outcome, Output, Reject, StreamFigures
from .router import MarketCore, now_ms
from .state import (
    EvictedValue,
    Holder,
    PurchaseRecord,
    Stores,
    StreamState,
    ValueEntry,
    ValueState,
)

__all__ = [
    "EvictedValue",
    "Holder",
    "MarketCore",
    "MarketKeys",
    "Outcome",
    "Output",
    "PurchaseRecord",
    "Reject",
    "Stores",
    "StreamFigures",
    "StreamState",
    "ValueEntry",
    "ValueState",
    "now_ms",
]
