"""GPU helpers' instrument: every FlashInfer autotuner lookup and every kernel it profiles, counted.

``count_tuner()`` wraps ``AutoTuner.search_cache`` (each lookup: op, input shapes, hit, runner,
tactic) and ``AutoTuner._profile_single_kernel`` (one per (runner, tactic) timed) for the rest of
the process. Used by tests/gpu_probes/v2_replay.py and tests/gpu_probes/vllm_replay.py (both run as scripts)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TunerCounters:
    lookups: list = field(default_factory=list)  # (custom_op, shapes, hit, runner class or None, repr(tactic))
    profiled: int = 0

    def reset(self) -> None:
        self.lookups.clear()
        self.profiled = 0

    @property
    def hits(self) -> int:
        return sum(1 for x in self.lookups if x[2])


def count_tuner() -> TunerCounters:
    from flashinfer.autotuner import AutoTuner

    counters = TunerCounters()
    search, profile = AutoTuner.search_cache, AutoTuner._profile_single_kernel

    def counted_search(self, custom_op, runners, input_shapes, *args, **kwargs):
        hit, r_id, tactic, prof = search(self, custom_op, runners, input_shapes, *args, **kwargs)
        shapes = tuple(tuple(int(d) for d in shape) for shape in input_shapes)
        counters.lookups.append((custom_op, shapes, bool(hit), runners[r_id].__class__.__name__ if hit else None,
                                 repr(tactic)))
        return hit, r_id, tactic, prof

    def counted_profile(self, *args, **kwargs):
        counters.profiled += 1
        return profile(self, *args, **kwargs)

    AutoTuner.search_cache = counted_search
    AutoTuner._profile_single_kernel = counted_profile
    return counters
