"""Careful mode's second phase: race each (op, bucket)'s candidates, then keep the winners.

After the ``repeats`` tunes of every op are saved, each (op, bucket) whose tunes disagree with
FlashInfer's default gets a race spec (``race.py`` runs it on a worker); the entries written are
the first tune's, each bucket's slots replaced by its race winner (``quality.choose``: the
default stays unless beaten by the threshold).

Then a *pair round* (``plan_pair_races``): the first race only forms the assignments the tunes
offered - a tune's winner, or the most chosen one with a single slot changed - but a MoE call's
two GEMMs interact (on Mixtral-8x7B TP2 gemm1 = 43 is 2.6% slower than 8 beside one gemm2 and
4.7% faster beside another: docs/quality.md, "Why careful misses on Mixtral"), so the fastest
pair can be one nobody raced. Each slot's fastest few values in the first race (its
*finalists*) are crossed into whole assignments and raced again with the default; that race's
winner is written.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from autotune_cache.errors import FiAutotuneError
from autotune_cache.tune.careful.context import neighbour_specs, race_contexts
from autotune_cache.tune.careful.quality import Candidate, QualitySettings, Selection, apply_selection, candidates, choose
from autotune_cache.tune.careful.workdir import merged_results, one_metadata, read_slot_records, tune_prefix


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


def plan_races(wd: Path, ops: list[dict], quality: QualitySettings,
               workloads: list[list[int]] | None = None) -> list[RacePlan]:
    """Every (op, bucket)'s candidates from its tunes' saved results, and a race spec file for
    each that has more than one (a race already run - its result file exists - is kept).
    ``workloads``: each workload's op indices (default: one of every op), for a race in context."""
    contexts = race_contexts(ops, workloads or [list(range(len(ops)))]) if quality.race_context else {}
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
                context = neighbour_specs(ops, contexts.get(i, []))
                spec.write_text(json.dumps({
                    "layer": i, "op": op, "bucket": b, "assignments": [c.entries() for c in cands],
                    "metadata": metas[0], "settings": quality.race_settings(b, op.get("bucket_rule")), "result": str(result),
                    "seed": 1000 * i + b, **({"context": context} if context else {})}))
            out.append(RacePlan(i, b, recs, cands, spec, result))
    return out


#: Whole assignments in one pair race at most (the default comes on top): with two slots and
#: ``pair_k`` 6 that is all 36; an op with more slots uses fewer finalists per slot.
MAX_PAIRS = 36


def slot_finalists(cands: list[Candidate], medians: list[float], k: int) -> dict[str, list[tuple]]:
    """Each slot's ``k`` fastest distinct (key, value) in a race, ranked by the best median of any
    raced assignment holding it (a tie: the earlier candidate). A candidate that failed (no finite
    median) and the default (it races on its own) offer nothing."""
    ranked = sorted((i for i, m in enumerate(medians) if math.isfinite(m) and m > 0 and not cands[i].default),
                    key=lambda i: (medians[i], i))
    out: dict[str, list[tuple]] = {}
    for i in ranked:
        for slot, (key, value) in cands[i].values.items():
            have = out.setdefault(slot, [])
            if len(have) < k and all((key, repr(value)) != (hk, repr(hv)) for hk, hv in have):
                have.append((key, value))
    return out


def pair_candidates(cands: list[Candidate], medians: list[float], k: int) -> list[Candidate]:
    """The pair round's candidates for one (op, bucket): the cross product of every slot's
    finalists (the first race's winner first, each raced assignment keeping the tunes that chose
    it), then the first race's default; empty when the product forms no assignment the first race
    did not already time - racing the same assignments again would only re-roll the noise."""
    finalists = slot_finalists(cands, medians, k)
    if len(finalists) < 2 or any(set(c.values) != set(finalists) for c in cands):
        return []
    per_slot = k
    while per_slot > 1 and per_slot ** len(finalists) > MAX_PAIRS:
        per_slot -= 1
    slots = sorted(finalists)
    raced = {c.signature(): c for c in cands}
    out, new = [], False
    for combo in itertools.product(*(finalists[s][:per_slot] for s in slots)):
        c = Candidate(dict(zip(slots, combo)))
        prev = raced.get(c.signature())
        new = new or prev is None
        out.append(Candidate(c.values, prev.sources) if prev is not None else c)
    if not new:
        return []
    return out + [c for c in cands if c.default]


def plan_pair_races(wd: Path, races: list[RacePlan], quality: QualitySettings) -> list[RacePlan]:
    """The pair round: for every (op, bucket) whose first race ran, a spec racing its slots'
    finalists crossed (``pair_candidates``); none where that forms nothing new, or ``pair_k`` is 0.
    A first race whose result is unreadable is left to ``select_op`` to report."""
    out = []
    for rp in races:
        if rp.spec is None or quality.pair_k < 1 or not rp.result.exists():
            continue
        try:
            spec = json.loads(rp.spec.read_text())
            medians = _medians(json.loads(rp.result.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        cands = pair_candidates(list(rp.candidates), medians, quality.pair_k)
        if not cands:
            continue
        pspec = wd / f"race.op{rp.op}.b{rp.bucket}.pair.json"
        presult = wd / f"race.op{rp.op}.b{rp.bucket}.pair.result.json"
        if not presult.exists():
            pspec.write_text(json.dumps({**spec, "assignments": [c.entries() for c in cands], "result": str(presult),
                                         "seed": spec.get("seed", 0) + 500_000}))
        out.append(RacePlan(rp.op, rp.bucket, rp.records, tuple(cands), pspec, presult))
    return out


def _medians(result: dict) -> list[float]:
    return [float("inf") if m is None else float(m) for m in result["medians_ms"]]


def _race_record(op: dict, rp: RacePlan, quality: QualitySettings) -> tuple[Selection, dict]:
    """The winner of one (op, bucket) and what the manifest records about its race."""
    cands = list(rp.candidates)
    if rp.spec is None:  # one candidate (every tune chose the default): nothing to race
        sel = Selection(0, (), None, None, False, "every tune chose it; nothing to race", len(cands[0].sources))
        return sel, sel.to_dict(cands, quality.tunes) | {"raced": False}
    try:
        result = json.loads(rp.result.read_text())
        medians = _medians(result)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FiAutotuneError(f"race result of {op['id']} at {rp.bucket} tokens unreadable ({e}); rerun warm") from None
    sel = choose(cands, medians, quality.threshold)
    return sel, sel.to_dict(cands, quality.tunes) | {
        "raced": True, "graph": result.get("graph"), "runs": max(result.get("runs") or [0]),
        "relative_iqr": [None if x is None else round(x, 4) for x in result.get("relative_iqr") or []],
        **({"span": result["span"]} if result.get("span") else {}),
        **({"errors": result["errors"]} if any(result.get("errors") or []) else {})}


def select_op(wd: Path, i: int, op: dict, quality: QualitySettings, races: list[RacePlan],
              pairs: list[RacePlan] = ()) -> tuple[dict, dict, dict]:
    """The entries written for one op in careful mode: the first tune's, with each bucket's
    slots replaced by its race winner (the default unless a tuned tactic beat it by the
    threshold) - the pair round's winner where one ran; and what was chosen and why, per
    bucket, for the manifest (the deciding race's record; the first race's under ``first_race``)."""
    per_tune = _per_tune(wd, i, quality)
    metas = [m for m, e in per_tune if e]
    meta = one_metadata(metas) if metas else {}
    entries: dict = {}
    for _, e in reversed(per_tune):  # the first tune's entries win where no race decides
        entries.update(e)
    chosen: dict = {}
    paired = {(p.op, p.bucket): p for p in pairs}
    for rp in races:
        if not rp.candidates:
            continue
        sel, record = _race_record(op, rp, quality)
        winner = list(rp.candidates)[sel.winner]
        pp = paired.get((rp.op, rp.bucket))
        if pp is not None:
            psel, precord = _race_record(op, pp, quality)
            winner = list(pp.candidates)[psel.winner]
            record = precord | {"pair_round": True, "first_race": record}
        entries = apply_selection(entries, list(rp.records), winner)
        chosen[str(rp.bucket)] = record
    return meta, entries, chosen
