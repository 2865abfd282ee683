"""The load side of a run: prompts (:mod:`datasets`, :mod:`tokens`), the streaming client
(:mod:`client`), load patterns (:mod:`patterns`, :mod:`executor`) and figures (:mod:`metrics`).
Headless: no Qt, no engine launching (that is :mod:`app.runner`)."""
