"""The ``epsilon-market`` commands, by who runs them: operators (``operator``), any party
(``party``: keys and accounts), sellers (``seller``) and buyers (``buyer``)."""
