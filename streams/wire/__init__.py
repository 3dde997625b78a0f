"""The wire: every event on every topic (:mod:`.events`), the topic layout (:mod:`.topics`) and
the sealing of releases for a buyer (:mod:`.sealing`). Clients in any language need only this
package's JSON Schemas (``docs/schemas/``) and these rules."""
