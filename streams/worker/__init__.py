"""The worker: a Faust app that feeds the input topics to the core and makes its effects durable.

``app`` (the Faust app and its agent) · ``batch`` (one batch: apply, persist, send) ·
``tables`` (stores as write-back Faust tables) · ``producer`` (acknowledged sends, topics, health
probes) · ``web`` (/metrics, /health, /ledger) · ``metrics`` · ``faust_internals`` (every patch
and private use of Faust, mode and aiokafka) · ``faults`` (fail points for crash tests) ·
``runner`` (in-process or child workers) · ``config`` (settings) · ``secrets`` (loading the
market's keys).
"""
