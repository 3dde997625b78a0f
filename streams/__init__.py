"""epsilon-market's streaming service: Faust workers selling privacy levels over Kafka.

Layout: :mod:`streams.events` (wire format), :mod:`streams.topics` (topic layout),
:mod:`streams.core` (business logic, no Kafka), :mod:`streams.app` (Faust worker),
:mod:`streams.client` (seller/buyer client), :mod:`streams.cli` (command line),
:mod:`streams.broker` and :mod:`streams.compat` (embedded Tansu broker and its workarounds).
The noise itself comes from :mod:`market` through :class:`market.ReleaseState` only.
"""
