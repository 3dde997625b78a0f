"""The market's users: the client library (:mod:`.client`), the ``epsilon-market`` command
line (:mod:`.cli`) and the live demo (:mod:`.demo`)."""
