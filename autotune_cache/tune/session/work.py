"""A plan as the work items a pool of workers is dealt: distinct ops, (op, bucket) queues, the
model skeleton. This is where the typed plan crosses the process boundary (JSON the worker reads)."""

from __future__ import annotations

import json

from autotune_cache.plan.tuning import TuningPlan


def distinct_ops(plan: TuningPlan) -> tuple[list[dict], list[list[int]]]:
    """Ops deduplicated across workloads (same call, same keys), and each workload's op indices,
    as the JSON the worker reads: this is where the typed plan crosses the process boundary."""
    uids: dict[str, int] = {}
    ops: list[dict] = []
    per_workload: list[list[int]] = []
    for w in plan.workloads:
        idx = []
        for op in (o.to_dict() for o in w.ops):
            sig = json.dumps({k: v for k, v in op.items() if k not in ("layers", "id")}, sort_keys=True)
            if sig not in uids:
                uids[sig] = len(ops)
                ops.append(op)
            idx.append(uids[sig])
        per_workload.append(idx)
    return ops, per_workload


def profiles_of(ops: list[dict]) -> int:
    """Profiles (one per custom op and bucket) the ops tune."""
    return sum(len(op["buckets"]) * len(op["custom_ops"]) for op in ops)


def work_queue(ops: list[dict], done: list[set[int]]) -> list[tuple[int, int]]:
    """The (op, bucket) items still to tune, in the order they are dealt: op by op (a worker
    switches ops, and so saves, as rarely as possible), largest bucket first within an op (the
    longest profiles start early, the short ones fill the gaps at the end)."""
    return [(i, b) for i, op in enumerate(ops) for b in sorted((b for b in op["buckets"] if b not in done[i]), reverse=True)]


#: Tokens' worth of fixed cost per profiled tactic (launch, synchronisation, the autotuner's own
#: bookkeeping): below a few hundred tokens a profile's time hardly depends on the bucket.
FIXED_TOKENS = 256


def profile_cost(op: dict, bucket: int) -> int:
    """A relative cost of tuning ``op`` at ``bucket`` tokens, for ordering work only: one profile
    per custom op, each growing with the tokens beyond a fixed part (``FIXED_TOKENS``)."""
    return len(op["custom_ops"]) * (FIXED_TOKENS + bucket)


def skeleton_of(plan: TuningPlan) -> dict:
    """The worker's model skeleton: the LM head it stubs (in a fleet any target's will do: it is
    never run for real, only its stub)."""
    res = plan.resolution
    return {"hidden": plan.spec.hidden_size, "vocab": plan.spec.vocab_size, "tp": res.flags.tp,
            "dp": res.attn_dp_size, "dtype": res.dtype}
