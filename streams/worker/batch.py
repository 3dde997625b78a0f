"""One batch of input events, in the order that makes replays harmless.

1. every event goes through :meth:`MarketCore.handle`, with Faust's "current event" set to it so
   table writes go to the changelog partition of the event's stream;
2. the batch's state (every changed table key, once) is sent and **acknowledged** by the broker;
3. only then are the outputs (releases, receipts, rejections, catalog entries) sent and
   acknowledged; the agent acknowledges the events afterwards, and Faust commits them later.

A worker that dies at any point therefore never leaves a visible release whose state is not
durable; the batch is processed again and the core's idempotency turns it into identical
re-emissions.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..core import MarketCore
from .faults import FaultInjector
from .metrics import Metrics
from .producer import Producer
from .tables import Record, WriteBackTable

__all__ = ["BatchProcessor"]

log = logging.getLogger("emarket.worker")


class BatchProcessor:
    """Applies batches of events to the core and makes their effects durable, then visible."""

    def __init__(
        self,
        core: MarketCore,
        tables: list[WriteBackTable],
        producer: Producer,
        metrics: Metrics,
        faults: FaultInjector,
        *,
        profile: bool = False,
    ) -> None:
        self.core = core
        self.tables = tables
        self.producer = producer
        self.metrics = metrics
        self.faults = faults
        self.profile = profile

    async def process(self, stream: Any, events: list[Any]) -> None:
        """Process ``events`` (Faust events of ``stream``); return once outputs are acked."""
        t_start = time.perf_counter()
        self.faults.hit("before_state")
        outputs, purchase_times = self._apply(stream, events)
        self.metrics.batch_size.observe(len(events))
        t_proc = time.perf_counter()
        state = [r for tbl in self.tables for r in tbl.drain(stream)]
        await self.producer.send_all(state)
        t_state = time.perf_counter()
        self.faults.hit("after_state")
        await self.producer.ensure_topics(r.topic for r in outputs)
        await self.producer.send_all(outputs, fail_point="mid_output")
        t_out = time.perf_counter()
        if self.profile:
            log.warning("batch %d events: process %.1f ms, state %.1f ms, outputs %.1f ms %s",
                        len(events), (t_proc - t_start) * 1e3, (t_state - t_proc) * 1e3,
                        (t_out - t_state) * 1e3,
                        [(e.message.partition, e.message.offset) for e in events])  # fmt: skip
        self.faults.hit("after_output")
        now = time.time()
        for ts in purchase_times:
            self.metrics.purchase_latency.observe(max(0.0, now - ts))
        self.metrics.batch_done(now)

    def _apply(self, stream: Any, events: list[Any]) -> tuple[list[Record], list[float]]:
        """Run every event through the core; return the outputs and the purchases' timestamps."""
        outputs: list[Record] = []
        purchase_times: list[float] = []
        with self.core.batch() as deliveries:
            for i, ev in enumerate(events):
                if i == len(events) // 2:
                    self.faults.hit("mid_batch")
                stream._set_current_event(ev)
                msg = ev.message
                outcome = self.core.handle(
                    msg.topic, ev.value, partition=msg.partition, offset=msg.offset
                )
                self.metrics.record(outcome)
                if outcome.status == "duplicate":
                    log.info("duplicate %s event at %s[%s]@%s: %.120r", outcome.kind, msg.topic,
                             msg.partition, msg.offset, ev.value)  # fmt: skip
                outputs.extend(Record(o.topic, o.key, o.value) for o in outcome.outputs)
                if outcome.kind == "purchase" and msg.timestamp:
                    purchase_times.append(float(msg.timestamp))
        outputs.extend(Record(o.topic, o.key, o.value) for o in deliveries)
        return outputs, purchase_times
