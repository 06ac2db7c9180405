"""The request a warm recorded in an entry's manifest: what ``verify`` and ``diff --measure``
replay to rebuild the entry's plan without the original flags."""

from __future__ import annotations

from autotune_cache.errors import FiAutotuneError, UsageError
from autotune_cache.plan.request import TuneRequest


def request_of(entry) -> TuneRequest:
    """The request warm recorded in an entry's manifest (format 2), or its raw flags (format 1)."""
    m = entry.manifest
    if m is None:
        raise UsageError(f"{entry.id} was not written by fi-autotune warm: give --model and the server's flags")
    try:
        if m.request is not None:
            return TuneRequest.from_dict(m.request)
        if "plan_args" in m.extra:
            return TuneRequest.from_plan_args(dict(m.extra["plan_args"]))
    except (KeyError, TypeError, ValueError) as e:
        raise FiAutotuneError(f"{entry.id}: its manifest's request cannot be replayed here ({e}); "
                              "give --model and the server's flags") from None
    raise UsageError(f"{entry.id} was not written by fi-autotune warm: give --model and the server's flags")
