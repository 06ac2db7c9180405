"""The warm/fleet session: one warm is a fleet of one target (``warm`` -> ``fleet`` -> ``fleetrun``):
plans become work items (``work``), are dealt to the pool, committed as each target's buckets are
done (``commit``, through the plan's layout), timed (``timings``), then converted and pushed
(``publish``); ``session`` is the library side of the ``warm`` command; ``recorded`` rebuilds an
entry's plan from its manifest."""
