"""Careful mode's second phase: race each (op, bucket)'s candidates, then keep the winners.

After the ``repeats`` tunes of every op are saved, each (op, bucket) whose tunes disagree with
FlashInfer's default gets a race spec (``race.py`` runs it on a worker); the entries written are
the first tune's, each bucket's slots replaced by its race winner (``quality.choose``: the
default stays unless beaten by the threshold).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from autotune_cache.errors import FiAutotuneError
from autotune_cache.tune.quality import QualitySettings, Selection, apply_selection, candidates, choose
from autotune_cache.tune.workdir import merged_results, one_metadata, read_slot_records, tune_prefix


@dataclass(frozen=True)
class RacePlan:
    """One (op, bucket) of a careful run: what its tunes stored and the candidates to race.
    ``spec`` is None when there is nothing to race (one candidate, or no tune recorded it)."""

    op: int
    bucket: int
    records: tuple  # per tune: list[SlotRecord] | None
    candidates: tuple
    spec: Path | None
    result: Path


def _per_tune(wd: Path, op: int, quality: QualitySettings) -> list[tuple[dict, dict]]:
    return [merged_results(wd, tune_prefix(op, r)) for r in range(quality.tunes)]


def plan_races(wd: Path, ops: list[dict], quality: QualitySettings) -> list[RacePlan]:
    """Every (op, bucket)'s candidates from its tunes' saved results, and a race spec file for
    each that has more than one (a race already run - its result file exists - is kept)."""
    out = []
    for i, op in enumerate(ops):
        per_tune = _per_tune(wd, i, quality)
        metas = [m for m, e in per_tune if e]
        records = [read_slot_records(wd, tune_prefix(i, r)) for r in range(quality.tunes)]
        for b in sorted(op["buckets"]):
            recs = tuple(rec.get(b) for rec in records)
            cands = tuple(candidates(list(recs), [e for _, e in per_tune], quality.top_k))
            spec, result = wd / f"race.op{i}.b{b}.json", wd / f"race.op{i}.b{b}.result.json"
            if len(cands) < 2 or not metas:
                out.append(RacePlan(i, b, recs, cands, None, result))
                continue
            if not result.exists():
                spec.write_text(json.dumps({
                    "layer": i, "op": op, "bucket": b, "assignments": [c.entries() for c in cands],
                    "metadata": metas[0], "settings": quality.race_settings(b), "result": str(result),
                    "seed": 1000 * i + b}))
            out.append(RacePlan(i, b, recs, cands, spec, result))
    return out


def _race_record(op: dict, rp: RacePlan, quality: QualitySettings) -> tuple[Selection, dict]:
    """The winner of one (op, bucket) and what the manifest records about its race."""
    cands = list(rp.candidates)
    if rp.spec is None:  # one candidate (every tune chose the default): nothing to race
        sel = Selection(0, (), None, None, False, "every tune chose it; nothing to race", len(cands[0].sources))
        return sel, sel.to_dict(cands, quality.tunes) | {"raced": False}
    try:
        result = json.loads(rp.result.read_text())
        medians = [float("inf") if m is None else float(m) for m in result["medians_ms"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FiAutotuneError(f"race result of {op['id']} at {rp.bucket} tokens unreadable ({e}); rerun warm") from None
    sel = choose(cands, medians, quality.threshold)
    return sel, sel.to_dict(cands, quality.tunes) | {
        "raced": True, "graph": result.get("graph"), "runs": max(result.get("runs") or [0]),
        "relative_iqr": [None if x is None else round(x, 4) for x in result.get("relative_iqr") or []],
        **({"errors": result["errors"]} if any(result.get("errors") or []) else {})}


def select_op(wd: Path, i: int, op: dict, quality: QualitySettings, races: list[RacePlan]) -> tuple[dict, dict, dict]:
    """The entries written for one op in careful mode: the first tune's, with each bucket's
    slots replaced by its race winner (the default unless a tuned tactic beat it by the
    threshold); and what was chosen and why, per bucket, for the manifest."""
    per_tune = _per_tune(wd, i, quality)
    metas = [m for m, e in per_tune if e]
    meta = one_metadata(metas) if metas else {}
    entries: dict = {}
    for _, e in reversed(per_tune):  # the first tune's entries win where no race decides
        entries.update(e)
    chosen: dict = {}
    for rp in races:
        if not rp.candidates:
            continue
        sel, record = _race_record(op, rp, quality)
        entries = apply_selection(entries, list(rp.records), list(rp.candidates)[sel.winner])
        chosen[str(rp.bucket)] = record
    return meta, entries, chosen
