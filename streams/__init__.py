"""epsilon-market's streaming service: Faust workers selling privacy levels over Kafka.

The folders follow the architecture, and the event path reads from the file names:

* :mod:`streams.wire` — what travels on the topics: events, topic names, sealing;
* :mod:`streams.core` — the market's logic over events, no Kafka (router → registrations,
  values → delivery, purchases; rejections, horizon, state);
* :mod:`streams.worker` — the Faust app that feeds events to the core and makes its effects
  durable, then visible (batch, tables, producer, web, metrics, faust_internals, runner);
* :mod:`streams.clients` — the seller/buyer client library, the command line, the demo;
* :mod:`streams.broker` — the embedded Tansu broker, topic administration, credentials.

The noise itself comes from :mod:`market`; control flows down from here into it.
"""
