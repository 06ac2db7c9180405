"""Engine startup logs read back: what a server really loaded and tuned at boot (``doctor``).

Everything else fi-autotune says about a server is a prediction (``plan``, ``check``) or a
replay on our GPU (``verify``); the server's own log is the one witness of what happened, and
from a user's cluster (a Blackwell one above all) it is the only evidence that comes back.

``formats``: the lines, from the engines' source; ``reader``: a log into events; ``boot``: the
events into servers, ranks and autotune passes; ``trees``: a logged cache path found in our
trees; ``diagnose``: the report, with one cause per pass that tuned.
"""
