"""The market's logic over events, without Kafka: the event path reads from the file names.

======================  =========================================================================
``router``              :class:`MarketCore`: read, authenticate and place each event once, then
                        call its handler; errors → rejections
``accounts``            ``open_account`` / ``rotate_keys`` → account, inbox topic
``registrations``       ``register_stream`` → stream, catalog entry
``values``              a value batch → each value kept and released by its stream's product
``purchases``           a purchase → recall, then fulfil or refuse, then keep
``sales``               a fulfilment → the sale notice in its seller's inbox
``quotes``              a quote → what a purchase would cost (``planning``: the step and price)
``rejections``          a refused event → a ``Rejection`` its sender can act on
``stream``              :class:`~.stream.Stream`: a stream's record, terms, product and ledger;
                        ``stream_store`` loads it once per event and saves it in one place
``ledger``              the privacy ledger: the one gate of every release, and the one writer
                        of spends (values' losses, window sums) and charges
``products/``           what a stream sells (vectors, histograms, running totals), one protocol
``replay/``             recall, keep, forget; time admission; watermarks
``delivery``            subscription deliveries, batched per buyer and stream
``state``               the stored records and their stores; ``codecs`` their bytes
``context``             the services every handler shares; ``outputs`` what handlers return
``keys``                the market's signing key and noise secret
======================  =========================================================================

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
