"""Careful's stop rule: when a race's ranking is settled (issue 34).

Careful's races (``race.py``) and the exhaustive reference (``benchmarks/tactic_exhaustive.py``,
every valid (runner, tactic) of every slot at every bucket) both run it. What needs no GPU, so it
is tested on CPU:

* :func:`center` - a candidate's time from its timed runs: their median, or with strata (rotating
  input draws, several CUDA graphs per candidate: ``race.py`` tags each run) the mean over strata of
  each stratum's median;
* :func:`bootstrap` - from every candidate's timed samples, the probability (resampling each
  candidate's samples with replacement, within each stratum, centers compared) that the observed
  fastest stays fastest, and that it stays within ``tie`` of the fastest. The strata are held fixed:
  how far another set of graphs would read is not in it (docs/quality.md, "Graph instances");
* :func:`shortlist` / :func:`stable` - which candidates go on racing after the screen, and when to stop;
* :func:`settle` - that rule as a race: careful's races (``race.py``) and the benchmark's sweep both run it.

How far each pick kind lands from the exhaustive best is the benchmark's own report
(``benchmarks/exhaustive_report.py``).
"""

from __future__ import annotations

import math
import random
import statistics

#: Stop racing an (op, bucket) when its fastest stays fastest in this share of bootstrap draws ...
CONFIDENCE = 0.95
#: ... or stays within this fraction of the fastest (a tie: either is "best" for the 1% target).
TIE = 0.005
#: After the screen, keep racing every candidate within this fraction of the screen's best ...
KEEP = 0.03
#: ... and at least this many.
KEEP_MIN = 4


def median(xs) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(xs) if xs else math.inf


def strata(xs: list[float], draws: list[int] | None) -> list[list[float]]:
    """A candidate's finite runs split by the input draw each timed (one stratum without draws)."""
    if not draws:
        return [[x for x in xs if x is not None and math.isfinite(x)]]
    by: dict[int, list[float]] = {}
    for x, d in zip(xs, draws):
        if x is not None and math.isfinite(x):
            by.setdefault(d, []).append(x)
    return [by[d] for d in sorted(by)]


def center(xs: list[float], draws: list[int] | None = None) -> float:
    """A candidate's time: the median of its runs; with rotating input draws (``draws[j]``: the draw
    run j timed), the mean over draws of each draw's median. Why: a MoE's call time depends on its
    routing - at 2 tokens Mixtral's top-2 of 8 experts touches 3 or 4 experts, 0.22 or 0.27 ms - so
    runs over several draws pile up in one mode per draw, and the median of the pool falls in the gap
    between modes, where a few runs more of one draw move it by 10% (Mixtral TP2, 4 draws: the best's
    interquartile range was 21% and the reference's own ranking held in 21% of bootstrap draws). Per
    draw the runs spread by about 1%; the mean weighs every draw alike, as the engine meets them."""
    meds = [median(s) for s in strata(xs, draws)]
    meds = [m for m in meds if math.isfinite(m)]
    return sum(meds) / len(meds) if meds else math.inf


def bootstrap(samples: list[list[float]], iters: int = 1000, tie: float = TIE, seed: int = 0,
              draws: list[list[int]] | None = None) -> dict:
    """``samples[i]``: candidate i's timed runs (ms), ``draws[i]`` (optional) the input draw of each.
    Returns the observed ranking (by :func:`center`) and, over ``iters`` resamplings (each draw's runs
    resampled apart), ``p_top1`` (the observed fastest is the fastest) and ``p_within_tie`` (the
    observed fastest is within ``tie`` of the fastest). Candidates without samples never rank."""
    tags = draws or [None] * len(samples)
    meds = [center(s, t) for s, t in zip(samples, tags)]
    live = [i for i, m in enumerate(meds) if math.isfinite(m)]
    ranked = sorted(live, key=lambda i: (meds[i], i))
    out = {"medians_ms": meds, "ranked": ranked, "best": ranked[0] if ranked else None,
           "p_top1": None, "p_within_tie": None, "runner_up_gap": None, "iters": iters, "tie": tie}
    if not ranked:
        return out
    if len(ranked) > 1:
        out["runner_up_gap"] = meds[ranked[1]] / meds[ranked[0]] - 1
    if len(ranked) == 1:
        out["p_top1"] = out["p_within_tie"] = 1.0
        return out
    best = ranked[0]
    rows = _resampled_centers([strata(samples[i], tags[i]) for i in live], iters, seed)  # per resampling, per candidate
    mine = live.index(best)
    top1 = within = 0
    for row in rows:
        fastest = min(row)
        top1 += row[mine] <= fastest
        within += row[mine] <= fastest * (1 + tie)
    out["p_top1"], out["p_within_tie"] = top1 / iters, within / iters
    return out


def _resampled_centers(cands: list[list[list[float]]], iters: int, seed: int) -> list[list[float]]:
    """``iters`` bootstrap resamplings: every stratum (one input draw's runs) of every candidate
    resampled with replacement, its median, the candidate's the mean of those (numpy when present:
    the benchmark calls this after every batch of rounds)."""
    cands = [[p for p in c if p] for c in cands]
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is everywhere torch is
        rng = random.Random(seed)
        out = []
        for _ in range(iters):
            out.append([sum(statistics.median(p[int(rng.random() * len(p))] for _ in range(len(p))) for p in c) / len(c)
                        for c in cands])
        return out
    rng = np.random.default_rng(seed)
    cols = [np.mean([np.median(np.asarray(p, dtype=float)[rng.integers(0, len(p), size=(iters, len(p)))], axis=1)
                     for p in c], axis=0) for c in cands]
    return np.stack(cols, axis=1).tolist()


def shortlist(medians: list[float], keep: float = KEEP, k_min: int = KEEP_MIN) -> list[int]:
    """The candidates to go on racing after the screen: every one within ``keep`` of the best, and
    at least the ``k_min`` fastest (by median; failed ones - infinite medians - never)."""
    live = sorted((i for i, m in enumerate(medians) if math.isfinite(m)), key=lambda i: (medians[i], i))
    if not live:
        return []
    best = medians[live[0]]
    return [i for j, i in enumerate(live) if j < k_min or medians[i] <= best * (1 + keep)]


def stable(boot: dict, confidence: float = CONFIDENCE) -> bool:
    """The ranking's top is settled: its fastest stays fastest, or stays within the tie, in
    ``confidence`` of the bootstrap draws."""
    if boot["best"] is None:
        return True
    return (boot["p_top1"] or 0) >= confidence or (boot["p_within_tie"] or 0) >= confidence


def settle(time_rounds, n: int, *, rounds: int, screen_rounds: int, batch_rounds: int, max_rounds: int,
           keep: float = KEEP, keep_min: int = KEEP_MIN, confidence: float = CONFIDENCE, seed: int = 0) -> tuple[list, dict]:
    """A race that spends its rounds where the ranking's top is still open: every one of ``n``
    candidates is timed ``screen_rounds`` rounds (the screen); those within ``keep`` of the fastest
    (at least ``keep_min``) race on to ``rounds`` in all, then in batches of ``batch_rounds`` until
    :func:`stable` says the fastest is settled (fastest, or within the tie, in ``confidence`` of the
    bootstrap draws) or ``max_rounds`` is reached.

    ``time_rounds(live, k, seed)`` times the ``live`` candidates ``k`` interleaved rounds and returns
    one list of samples per candidate (empty for the others), or ``(samples, draws)`` with the input
    draw of every sample: ``race.py`` on a GPU, a stand-in in the CPU tests. Returns every candidate's
    samples (a screened-out one keeps its screen), their draws (None without), and what happened: how
    many were shortlisted, the rounds the shortlist ran, and the last bootstrap's confidence. Why:
    careful races every tactic a tune timed (about 90 per MoE bucket); 50 rounds each would spend most
    of the race on tactics 10% off, and too few where two are 0.3% apart."""
    samples, draws, tagged = _split(time_rounds(list(range(n)), screen_rounds, seed))
    top = shortlist([center(s, d) for s, d in zip(samples, draws)], keep, keep_min)
    done, batch, boot = screen_rounds, 0, None
    while top:
        if done >= rounds:
            boot = bootstrap([samples[i] for i in top], seed=seed + batch, draws=[draws[i] for i in top])
            if stable(boot, confidence) or done >= max_rounds:
                break
        batch += 1
        step = rounds - done if done < rounds else max(1, min(batch_rounds, max_rounds - done))
        more, more_draws, _ = _split(time_rounds(top, step, seed + 7919 * batch))
        for i in top:
            samples[i].extend(more[i])
            draws[i].extend(more_draws[i])
        done += step
    info = {"screened": n, "shortlist": len(top), "top": top, "rounds": done,
            "runner_up_gap": boot["runner_up_gap"] if boot else None,
            "p_top1": boot["p_top1"] if boot else None, "p_within_tie": boot["p_within_tie"] if boot else None,
            "stable": stable(boot, confidence) if boot else not top}
    return samples, (draws if tagged else None), info


def _split(timed) -> tuple[list[list[float]], list[list[int]], bool]:
    """``time_rounds``' answer as (samples, draws, whether it gave draws): draw 0 for every sample
    where it gave none."""
    samples, draws = timed if isinstance(timed, tuple) else (timed, None)
    samples = [list(s) for s in samples]
    if draws is None:
        return samples, [[0] * len(s) for s in samples], False
    return samples, [list(d) for d in draws], True


def relative_iqr(samples: list[float], draws: list[int] | None = None) -> float | None:
    """The interquartile range over the median; with input draws, of every run over its own draw's
    median (the timing noise, not the spread between draws' routings)."""
    if len(samples) < 4:
        return None
    if draws:
        meds = {}
        for x, d in zip(samples, draws):
            meds.setdefault(d, []).append(x)
        meds = {d: statistics.median(v) for d, v in meds.items()}
        if any(m <= 0 for m in meds.values()):
            return None
        samples, m = [x / meds[d] for x, d in zip(samples, draws)], 1.0
    else:
        m = statistics.median(samples)
    q = statistics.quantiles(samples, n=4)
    return (q[2] - q[0]) / m if m > 0 else None
