"""Careful tuning: which tactic to write when several tunes disagree - the selection rules.

An engine tunes each (op, bucket) once, a few runs per tactic, on a GPU busy starting a server,
and keeps whatever won: two fresh tunes of one model disagree on many entries, and a tactic 2x
slower than FlashInfer's default can win. A cache made ahead of time can do better:

1. tune every (op, bucket) ``R`` times (independent FlashInfer tunes, spread over the GPUs);
2. the distinct winners race head to head on one GPU with FlashInfer's default, interleaved,
   many timed runs each, the median kept (``race.py``);
3. the fastest is written, unless it beats the default by less than ``threshold``: then the
   default stays (a floor against noise and against tactics that only win on a busy GPU).

What a tune chooses for one (op, bucket) is an *assignment*: for every *slot* - one lookup the
call makes, e.g. a MoE call's two GEMMs - the cache key and value FlashInfer stored. FlashInfer
stores a winner under the key of the runner that won, so two tunes that pick different runners
(fp8_gemm on Hopper has a cuBLAS and a cuDNN runner) write different keys for one slot. A slot
is therefore named by its *default key*: the key of ``runners[0]``, the runner FlashInfer falls
back to with tactic -1 when nothing is cached - which is what "the default" means here.

This module holds steps 2's inputs and 3 - no torch, so it is tested on CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autotune_cache.autotuner.buckets import served_below
from autotune_cache.autotuner.rankfile import parse_file_key
from autotune_cache.tune.careful.settle import KEEP, TIE

#: Keep FlashInfer's default unless a tuned tactic is at least this much faster (median vs median).
#: Others use 3-4% (tokenspeed#1338: 4%), for one noisy startup measurement. Here the default is
#: raced head to head with the winners, so the floor only has to break ties the race cannot
#: resolve - and a tie is what the race's own stop rule calls one (``settle.TIE``, 0.5%): one
#: number for "too close to act on". It was 1% until issue 47: on Llama-3.1-70B FP8 TP8 (H200) the
#: 1% floor kept the default at 24 of 84 buckets, at 3 of them (o_proj @ 1024, gate_up @ 128,
#: qkv @ 3072) against a tactic careful's race had 0.5-0.96% ahead and two reference runs then
#: confirmed 0.6-2.7% ahead - where the engine's own pick was the best. Replaying the recorded races
#: of 6 careful caches at 0.5% (docs/quality.md, "Six workloads"): within 1% of the best 196 -> 197 of
#: 200 (TP4), 78 -> 77 and 78 -> 80 of 84 (TP8, two reference runs); more than 0.5% behind the
#: engine's pick 8 -> 4 and 7 -> 2. MoE choices cannot move: their default is >= 2.29x as slow.
DEFAULT_THRESHOLD = TIE

#: Token-input draws (a MoE's routing, the activations) every race rotates over, one per round, each
#: draw's runs kept apart (``settle.center``). Why: on Mixtral-8x7B TP2 at 1024 tokens gemm1
#: tactic 33 was as fast as 32 for some draws and 4-12% slower for others, so a race over one draw
#: crowned 33 in careful's worker and the reference crowned 32; with 4 draws on both sides careful
#: matched the reference at every (op, bucket) of 1024-8192 tokens (docs/quality.md).
DEFAULT_INPUT_DRAWS = 4

#: CUDA graphs of each candidate in a race, every one timed every round, their strata averaged
#: (``race.py``). Why: at some calls one graph reads up to 0.8% off the others of the same
#: assignment, 3-4.5x its median's error, and with one graph per candidate careful's race read Llama
#: FP8 TP4 qkv_proj @ 2's default 1.0% ahead of tactic 1 where every reference race had it 1.2-1.9%
#: behind (docs/quality.md, "Graph instances"). Three cost careful's TP4 racing 9% more time.
DEFAULT_GRAPH_INSTANCES = 3

#: Token counts an eager race times each candidate at, spread over the bucket's range (the counts
#: FlashInfer maps up to the bucket: ``bucket_span``), one a round (``race._Candidates``). Why: the
#: entry serves them all, and a cuBLAS tactic fastest at the bucket's own count was 1.6-12.3% slower
#: than the default at another count of 9 of 10 eager buckets of Llama-3.1-70B FP8 TP8 (H200;
#: docs/quality.md, "A bucket serves a range"); the timing is bumpy from count to count (o_proj @
#: 1024's tactic 4 read +4.8, +3.6, -4.8, +7.6, -6.1% at 769-1024), so three counts were too few.
#: Each count has token inputs of its own, so a span replaces the input draws in an eager race.
DEFAULT_SPAN = 5

#: FlashInfer's fallback tactic (``runners[0]`` with this tactic when a lookup misses).
DEFAULT_TACTIC = -1


@dataclass(frozen=True)
class SlotRecord:
    """What one tune stored for one slot of one bucket (the worker records it as it tunes)."""

    slot: str  # the default key: runners[0]'s key for this lookup
    key: str  # the key the winner was stored under
    default_runner: str  # runners[0]'s class name
    #: The tune's runners-up for this slot, fastest first by the tune's own timing: (key, runner,
    #: tactic) each. Careful races the first ``top_k`` of them beside the winners (``candidates``).
    alternatives: tuple = ()

    def to_dict(self) -> dict:
        d = {"slot": self.slot, "key": self.key, "default_runner": self.default_runner}
        if self.alternatives:
            d["alt"] = [list(a) for a in self.alternatives]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SlotRecord":
        alt = tuple((str(a[0]), str(a[1]), a[2]) for a in d.get("alt") or ())
        return cls(str(d["slot"]), str(d["key"]), str(d["default_runner"]), alt)


@dataclass(frozen=True)
class Candidate:
    """One assignment: slot -> (key, value) for every slot of an (op, bucket)."""

    values: dict  # slot -> (key, [runner, tactic, policy?])
    sources: tuple[int, ...] = ()  # the tunes (0-based) that chose it
    default: bool = False

    def signature(self) -> tuple:
        return tuple(sorted((s, k, v[0], repr(v[1])) for s, (k, v) in self.values.items()))

    def entries(self) -> dict:
        """The cache entries this assignment writes (key -> value)."""
        return {k: list(v) for k, v in self.values.values()}

    def describe(self) -> str:
        """``gemm1=MoERunner:41 gemm2=MoERunner:83``: each lookup's op (last part), runner, tactic."""
        if self.default:
            return f"default (tactic {DEFAULT_TACTIC})"
        return " ".join(f"{_short_op(slot)}={v[0]}:{v[1]}" for slot, (_, v) in sorted(self.values.items()))


def _short_op(slot: str) -> str:
    parsed = parse_file_key(slot)
    return parsed.custom_op.rsplit("::", 1)[-1] if parsed else "?"


def candidates(records: list[list[SlotRecord] | None], tunes: list[dict], top_k: int = 0) -> list[Candidate]:
    """Distinct assignments that the tunes chose for one (op, bucket), most chosen first, then
    each tune's ``top_k`` runners-up of every slot (the most chosen assignment with that one slot
    changed), then FlashInfer's default unless a tune chose it. ``records[r]`` is what tune ``r``
    stored for this bucket (None: not recorded), ``tunes[r]`` its cache entries (key -> value). A
    tune that misses a slot another tune filled (no tactic of any runner ran for it) offers nothing.

    Why runners-up: each tune is FlashInfer's 10-run measurement, and where several tactics are
    within a few percent every tune can miss the same better one; the exhaustive reference
    (``benchmarks/tactic_exhaustive.py``) found the fastest within a tune's top 5 at nearly every
    (op, bucket) where the tunes all missed it."""
    slots: dict[str, str] = {}  # slot -> default runner
    for recs in records:
        for rec in recs or ():
            slots.setdefault(rec.slot, rec.default_runner)
    by_sig: dict[tuple, Candidate] = {}
    order: list[tuple] = []
    policy = None
    for i, (recs, tune) in enumerate(zip(records, tunes)):
        if not recs:
            continue
        values = {rec.slot: (rec.key, list(tune[rec.key])) for rec in recs if rec.key in tune}
        if set(values) != set(slots):
            continue
        policy = policy or next((v[2] for _, v in values.values() if len(v) > 2), None)
        c = Candidate(values, (i,))
        sig = c.signature()
        if sig in by_sig:
            prev = by_sig[sig]
            by_sig[sig] = Candidate(prev.values, prev.sources + (i,))
        else:
            by_sig[sig] = c
            order.append(sig)
    out = sorted((by_sig[s] for s in order), key=lambda c: -len(c.sources))
    if not slots:
        return out
    if top_k > 0 and out:
        out += _runner_up_variants(records, out, top_k, set(by_sig))
    default = default_candidate(slots, policy)
    sig = default.signature()
    if sig in by_sig:  # a tune chose the default itself
        return [Candidate(c.values, c.sources, default=c.signature() == sig) for c in out]
    return out + [default]


def _runner_up_variants(records, chosen: list[Candidate], top_k: int, seen: set) -> list[Candidate]:
    """The most chosen assignment with one slot set to each tune's runners-up (first ``top_k`` of
    each tune, in tune order), the measurement policy kept; none that repeats an assignment."""
    base = chosen[0]
    out = []
    for recs in records:
        for rec in recs or ():
            if rec.slot not in base.values:
                continue
            policy = list(base.values[rec.slot][1][2:])
            for key, runner, tactic in rec.alternatives[:top_k]:
                c = Candidate({**base.values, rec.slot: (key, [runner, tactic, *policy])})
                sig = c.signature()
                if sig not in seen:
                    seen.add(sig)
                    out.append(c)
    return out


def default_candidate(slots: dict[str, str], policy=None) -> Candidate:
    """FlashInfer's fallback for every slot, written explicitly (so the engine finds an entry and
    does not tune again), with the tunes' measurement policy (which the engine's lookup checks)."""
    values = {s: (s, [runner, DEFAULT_TACTIC] + ([policy] if policy is not None else []))
              for s, runner in slots.items()}
    return Candidate(values, default=True)


@dataclass(frozen=True)
class Selection:
    winner: int  # index into the candidates
    medians_ms: tuple[float, ...]
    margin_runner_up: float | None  # runner-up / winner - 1 (None: no runner-up measured)
    margin_default: float | None  # default / winner - 1 (None: the default won or was not measured)
    kept_default: bool  # the fastest tuned tactic was under the threshold: the default stays
    reason: str = ""
    tunes_agreeing: int = 0  # how many of the tunes chose the winner

    def to_dict(self, cands: list[Candidate], tunes: int) -> dict:
        return {
            "winner": cands[self.winner].describe(), "default": cands[self.winner].default,
            "candidates": [c.describe() for c in cands],
            "medians_ms": [None if not math.isfinite(m) else round(m, 5) for m in self.medians_ms],
            "margin_runner_up": _round(self.margin_runner_up), "margin_default": _round(self.margin_default),
            "kept_default": self.kept_default, "tunes": tunes, "tunes_agreeing": self.tunes_agreeing,
            **({"reason": self.reason} if self.reason else {}),
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def choose(cands: list[Candidate], medians_ms: list[float], threshold: float = DEFAULT_THRESHOLD) -> Selection:
    """The fastest candidate by median; the default unless the fastest beats it by ``threshold``.
    A candidate that failed to run has an infinite median and never wins."""
    if len(cands) != len(medians_ms) or not cands:
        raise ValueError("one median per candidate")
    if not (math.isfinite(threshold) and threshold >= 0):
        raise ValueError(f"threshold must be a finite fraction >= 0, not {threshold}")
    finite = [i for i, m in enumerate(medians_ms) if math.isfinite(m) and m > 0]
    if not finite:
        first = next((i for i, c in enumerate(cands) if not c.default), 0)
        return Selection(first, tuple(medians_ms), None, None, False,
                         "no candidate could be measured: the most chosen one is written", len(cands[first].sources))
    ranked = sorted(finite, key=lambda i: (medians_ms[i], i))
    best = ranked[0]
    runner_up = medians_ms[ranked[1]] / medians_ms[best] - 1 if len(ranked) > 1 else None
    d = next((i for i, c in enumerate(cands) if c.default), None)
    if d is not None and best != d and d in finite:
        gain = medians_ms[d] / medians_ms[best] - 1
        if gain < threshold:
            return Selection(d, tuple(medians_ms), None, None, True,
                             f"fastest tuned tactic only {gain:.2%} faster than the default (< {threshold:.2%})",
                             len(cands[d].sources))
        return Selection(best, tuple(medians_ms), runner_up, gain, False, "", len(cands[best].sources))
    reason = "the default was fastest" if best == d else ("the default failed to run" if d is not None else "")
    return Selection(best, tuple(medians_ms), runner_up, None, False, reason, len(cands[best].sources))


def apply_selection(entries: dict, records: list[list[SlotRecord] | None], winner: Candidate) -> dict:
    """``entries`` with every key any tune stored for this bucket replaced by the winner's: a
    slot keeps exactly one key, so no other runner's entry shadows the winner at lookup."""
    out = dict(entries)
    for recs in records:
        for rec in recs or ():
            out.pop(rec.key, None)
            out.pop(rec.slot, None)
    out.update(winner.entries())
    return out


def selection_summary(selection: dict) -> dict:
    """Counts over the per-bucket records of a careful run (``{op: {bucket: record}}``, as the
    manifest keeps them), for ``stats``, ``warm``'s last line and ``show``."""
    rows = [r for per_op in selection.values() if isinstance(per_op, dict) for r in per_op.values() if isinstance(r, dict)]

    def median(values):
        values = sorted(v for v in values if isinstance(v, (int, float)))
        return values[len(values) // 2] if values else None

    return {
        "buckets": len(rows), "raced": sum(bool(r.get("raced")) for r in rows),
        "tuned_written": sum(not r.get("default") for r in rows),
        "default_kept_by_floor": sum(bool(r.get("kept_default")) for r in rows),
        "default_fastest": sum(bool(r.get("default")) and not r.get("kept_default") for r in rows),
        "tunes_unanimous": sum(r.get("tunes_agreeing") == r.get("tunes") for r in rows),
        "median_margin_over_default": median(r.get("margin_default") for r in rows),
        "median_margin_over_runner_up": median(r.get("margin_runner_up") for r in rows if not r.get("default")),
    }


#: Runners-up per slot and tune that careful races beside the winners - every tactic a tune timed,
#: up to this many. Eight were not enough: on Mixtral-8x7B TP2 (H100) the exhaustive best sat
#: beyond FlashInfer's own single-tune rank 9 at 1 of 42 (op, bucket), and where the two GEMMs
#: interact the pair round needs the best of each slot beside the other's, which a tune's short
#: ranking (timed beside another partner) does not hold (docs/quality.md, "Careful screens every
#: tactic"). The screen (``SCREEN_ROUNDS``) bounds the cost: careful on Mixtral went from 208 to
#: 321-327 GPU-s, most of it screening ~90 candidates per eager bucket.
DEFAULT_TOP_K = 64

#: Each slot's fastest values in the race crossed into whole assignments and raced again: the best
#: pair of a MoE call's GEMMs can be one no tune offered (docs/quality.md, "Why careful misses on
#: Mixtral"). 6 x 6 = 36 assignments per (op, bucket) with two slots: at 2 tokens on Mixtral the
#: best pair's values ranked 5th and 6th by slot in the first race of 8 runners-up, and on Qwen3
#: EP2 at 2048 tokens (raced over its span) the reference's gemm2 70 ranked 5th, 0.6% behind the
#: slot's best beside the first race's gemm1 32, so four finalists left careful's pick 1.3-1.5% slower
#: than the best pair (docs/quality.md, "EP2 and GLM-5.1 over the span, six finalists").
DEFAULT_PAIR_K = 6

#: A race's screen: every candidate this many rounds, then those within ``settle.KEEP`` (3%)
#: of the fastest - at least ``settle.KEEP_MIN`` - go on to ``race_rounds`` and then in
#: batches of ``BATCH_ROUNDS`` until the bootstrap settles the fastest (``settle.settle``)
#: or ``MAX_ROUNDS``. The exhaustive reference's own sweep uses the same rule.
SCREEN_ROUNDS = 20
BATCH_ROUNDS = 50
MAX_ROUNDS = 300


def bucket_span(rule: str | None, bucket: int, n: int) -> list[int] | None:
    """``n`` token counts evenly over (``served_below``, ``bucket``], the bucket last: the counts
    whose calls read the bucket's entry of an op with lookup ``rule``, for FlashInfer's hybrid
    mappers round a count up to the next bucket (``map_to_hybrid_bucket_uncapped``,
    ``make_hybrid_bucket_mapper``: tests/tune/careful/test_span.py checks this against them).
    None where the rule maps otherwise, or fewer than two counts would be left."""
    below = served_below(rule, bucket)
    if below is None or n <= 1 or below + 1 >= bucket:
        return None
    low = below + 1
    step = (bucket - low) / (n - 1)
    return sorted({round(low + k * step) for k in range(n)})


def _env_int(name: str, default: int) -> int:
    import os

    try:
        return max(0, int(os.environ.get(name, default)))
    except ValueError:
        return default


def _env_flag(name: str) -> bool:
    import os

    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class QualitySettings:
    """How carefully ``warm`` tunes: ``quick`` is one FlashInfer tune per (op, bucket), as an
    engine does at startup; ``careful`` is ``repeats`` tunes and a race of their winners."""

    mode: str = "quick"  # quick | careful
    repeats: int = 3
    threshold: float = DEFAULT_THRESHOLD
    race_rounds: int = 50  # timed runs per candidate in a race (interleaved) that passes the screen
    race_warmup: int = 5
    screen_rounds: int = SCREEN_ROUNDS  # 0: no screen, every candidate ``race_rounds`` runs
    max_rounds: int = MAX_ROUNDS
    cold_l2: bool = True  # flush L2 before each timed run: between layers, weights come from HBM
    graph_max_tokens: int = 0  # buckets up to this run as CUDA-graph replays in the race (decode sizes)
    #: Each tune's runners-up per slot raced beside the winners (``candidates``); 0: winners only.
    top_k: int = field(default_factory=lambda: _env_int("FI_AUTOTUNE_RACE_TOP_K", DEFAULT_TOP_K))
    #: Finalists per slot crossed in the pair round after the race (``careful.pair_candidates``); 0: none.
    pair_k: int = field(default_factory=lambda: _env_int("FI_AUTOTUNE_PAIR_K", DEFAULT_PAIR_K))
    #: Token-input draws a race rotates over, one per round (``race._Candidates``); 1: one draw.
    input_draws: int = field(default_factory=lambda: max(1, _env_int("FI_AUTOTUNE_RACE_INPUTS", DEFAULT_INPUT_DRAWS)))
    #: CUDA graphs per candidate in a graph race, each timed every round (``race.py``); 1: one graph.
    graph_instances: int = field(default_factory=lambda: max(1, _env_int("FI_AUTOTUNE_GRAPH_INSTANCES",
                                                                          DEFAULT_GRAPH_INSTANCES)))
    #: Token counts over an eager bucket's range each candidate is raced at (``bucket_span``); 1: the bucket's own.
    span: int = field(default_factory=lambda: max(1, _env_int("FI_AUTOTUNE_SPAN", DEFAULT_SPAN)))
    #: Race in context: the workload's other ops run untimed before every timed run (``context.py``);
    #: off until the reference has judged it (``FI_AUTOTUNE_RACE_CONTEXT=1`` turns it on).
    race_context: bool = field(default_factory=lambda: _env_flag("FI_AUTOTUNE_RACE_CONTEXT"))
    extra: dict = field(default_factory=dict)

    @property
    def careful(self) -> bool:
        return self.mode == "careful"

    @property
    def tunes(self) -> int:
        return self.repeats if self.careful else 1

    def race_settings(self, bucket: int, rule: str | None = None) -> dict:
        """What ``race.race`` takes for one bucket (the spec file carries it to the worker);
        ``rule``: the op's bucket rule, for an eager race's span (``bucket_span``)."""
        d = {"rounds": self.race_rounds, "warmup": self.race_warmup, "cold_l2": self.cold_l2,
             "graph": bucket <= self.graph_max_tokens}
        counts = None if d["graph"] else bucket_span(rule, bucket, self.span)
        if counts:
            d["span"] = counts
        if self.screen_rounds > 0:
            d.update(screen_rounds=min(self.screen_rounds, self.race_rounds), batch_rounds=BATCH_ROUNDS,
                     max_rounds=max(self.max_rounds, self.race_rounds))
        if self.input_draws > 1:
            d["input_draws"] = self.input_draws
        if d["graph"] and self.graph_instances > 1:
            d["graph_instances"] = self.graph_instances
        return d

    def to_dict(self) -> dict:
        d = {"mode": self.mode, "tunes": self.tunes}
        if self.careful:
            d.update(threshold=self.threshold, race_rounds=self.race_rounds, race_warmup=self.race_warmup,
                     cold_l2=self.cold_l2, graph_max_tokens=self.graph_max_tokens, top_k=self.top_k,
                     pair_k=self.pair_k, screen_rounds=self.screen_rounds, max_rounds=self.max_rounds, keep=KEEP,
                     input_draws=self.input_draws, graph_instances=self.graph_instances, span=self.span)
            if self.race_context:  # named only when on: every manifest before it raced without
                d["race_context"] = True
        return d
