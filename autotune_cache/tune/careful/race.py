"""Racing candidate tactics head to head on one GPU (careful tuning, ``diff --measure``).

Each candidate is an *assignment* of (runner, tactic) to the keys one call looks up. The op is
run exactly as the engine runs it - FlashInfer's public API, the tactic taken from a loaded
cache file (``AutoTuner.load_configs``), not forced through private hooks:

* buckets the engine runs under CUDA graphs (decode sizes): each candidate is captured once in
  a graph (its tactic baked in) and the graphs are replayed;
* larger buckets (prefill chunks, run eagerly by the engine): each timed call follows a load of
  that candidate's file, outside the timed window, and a stream delay (FlashInfer's own delay
  kernel, as its tuner does) that keeps the host's work for the call out of the window: without
  it, eager medians of 0.2-0.5 ms MoE calls spread by 20-50% (interquartile) on an H200.

Under CUDA graphs each candidate is captured ``graph_instances`` times and every graph is timed
each round. Why: at some calls one graph has a speed of its own - the same assignment captured
again (its own memory pool) reads up to 0.8% off, 3-4.5x its median's error, at Llama-3.1-70B FP8
TP4 qkv_proj @ 2 and GLM-5.1 @ 2 (``benchmarks/race_instances.py``, docs/quality.md "Graph
instances") - and with one graph per candidate careful's races there read the default 1.0% ahead of
a tactic every other measurement had 1.2-1.9% ahead of it. The engine's graph is one more instance
nobody can predict; the mean over several is what it meets on average. Each (input draw, graph) is a
stratum of ``settle.center``.

An eager race may be given a ``span``: token counts across the bucket's range, one per round in
turn (each count a stratum, with token inputs of its own - so no input draws on top: a stratum
needs several runs for ``settle``'s bootstrap to see its spread), so a candidate's time is its mean
over the counts the entry will serve. Why: FlashInfer maps a call's token count up to the next bucket, so one entry
serves (previous bucket, bucket], and a cuBLAS tactic is an index into the algorithm list cuBLASLt
gives for the exact count. On Llama-3.1-70B FP8 TP8 (H200) the tactic fastest at the bucket was
1.6-12.3% slower than FlashInfer's default at another count of 9 of 10 eager buckets raced - o_proj @
1280's tactic 1: 11.5% faster at 1216-1280 tokens, 1-4% slower at 1025-1152
(``benchmarks/race_instances.py --span``, docs/quality.md "A bucket serves a range").

A race may be given a ``context``: a call run untimed before every timed run (after the
candidate's file is loaded, before the L2 flush), with the round's token count - the way to put the
layer's other ops between two runs of one candidate, as a forward pass does (``context.py``; careful
passes one only where asked). Why: at
Llama-3.1-70B FP8 TP8 qkv_proj @ 768 (15-20 us) tactic 1 read 1.5-2.6% ahead of the default in
races of two or three candidates and 1.0% ahead to 0.4% behind in races of all nine
(docs/quality.md, "Race composition"): what runs between two runs of a small GEMM moves it.

Candidates are interleaved in a new random order every round, so drift (clocks, temperature,
other tenants) hits all alike; with ``cold_l2`` a 2x-L2 buffer is zeroed before every timed run
(untimed), as between layers the weights come from HBM. The median of each candidate's runs is
its time (with rotating input draws or several graphs, the mean of each stratum's median:
``settle.center``).
Needs torch, flashinfer and a GPU; imported by the worker only.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from autotune_cache.autotuner.rankfile import cache_file_bytes
from autotune_cache.tune.careful.context import Neighbours
from autotune_cache.tune.careful.settle import CONFIDENCE, KEEP, KEEP_MIN, center, relative_iqr, settle


class _Candidates:
    """The candidates of one race as cache files FlashInfer loads (its public path), and the call.

    With ``input_draws`` > 1 the call's token inputs (a MoE's routing, the activations) rotate
    over that many draws, one per round, copied in place into the tensors the call (and its CUDA
    graph) reads, before the round: every candidate of a round sees the same inputs. Why: on
    Mixtral-8x7B TP2 at 1024 tokens, gemm1 tactic 33 was 0.0-0.3% slower than 32 with two input
    draws and 4.0% and 8.6% slower with two others (``benchmarks/race_inputs.py``), so a race
    over one draw can crown a tactic that is fast only for it."""

    def __init__(self, tuner, layer, bucket: int, assignments: list[dict], metadata: dict | None, workdir: Path,
                 input_draws: int = 1, span: list[int] | None = None):
        self.tuner, self.layer = tuner, layer
        self.graph_fallback: str | None = None  # why a graph race ran eagerly (a capture failed), if it did
        self.draws: list[dict] = []
        #: With a span (eager only): the whole call's arguments per token count, one a round.
        self.counts: list[int] = list(span) if span and len(span) > 1 else []
        self.strata: list[dict] = [layer.call_kwargs(m) for m in self.counts]
        self.kwargs = self.strata[-1] if self.strata else layer.call_kwargs(bucket)  # the bucket's: the span's last
        self.tokens = bucket  # the round's token count (with a span, its count)
        if not self.counts and input_draws > 1:
            tensors = {k for k, v in self.kwargs.items() if hasattr(v, "copy_") and k not in layer.static}  # token-shaped
            self.draws = [{k: v for k, v in layer.call_kwargs(bucket, draw=d).items() if k in tensors}
                          for d in range(input_draws)]
        self.paths = []
        for i, values in enumerate(assignments):
            p = Path(workdir) / f"race-{os.getpid()}-{bucket}-{i}.json"
            # No _metadata (``diff --measure``): FlashInfer loads the file without an environment
            # check - the tactics are measured on this GPU whatever the caches were tuned on.
            p.write_bytes(cache_file_bytes(metadata, values) if metadata is not None else json.dumps(values).encode())
            self.paths.append(p)

    def inputs_for_round(self, r: int) -> int:
        """Round ``r``'s token inputs into the call's own tensors (no-op with one draw), or with a
        span its token count's own arguments; the stratum."""
        if self.strata:
            s = r % len(self.strata)
            self.kwargs, self.tokens = self.strata[s], self.counts[s]
            return s
        if not self.draws:
            return 0
        d = r % len(self.draws)
        for k, v in self.draws[d].items():
            self.kwargs[k].copy_(v)
        return d

    def use(self, i: int) -> bool:
        self.tuner.clear_cache()
        return bool(self.tuner.load_configs(str(self.paths[i])))

    def call(self) -> None:
        self.layer.api(**self.kwargs)

    def call_each_count(self) -> None:
        """The call at every token count of the span (the bucket's alone without one): a tactic
        that fails at any count the entry serves is ruled out before timing, not mid-race."""
        for kwargs in self.strata or [self.kwargs]:
            self.layer.api(**kwargs)

    def remove(self) -> None:
        self.tuner.clear_cache()
        for p in self.paths:
            p.unlink(missing_ok=True)


def _first_runs(torch, c: _Candidates, n: int, graph: bool, instances: int = 1) -> tuple[list, list, bool]:
    """Each candidate run once (a failure or a rejected file rules it out), then captured in
    ``instances`` CUDA graphs if ``graph`` (``graphs[i]``: candidate i's list): all candidates as
    graph replays, or none - timing one as a replay and another with its launch overhead would not
    compare like with like."""
    errors: list[str | None] = [None] * n
    graphs: list = [None] * n
    for i in range(n):
        try:
            if not c.use(i):
                errors[i] = "FlashInfer here rejected the file's _metadata"
                continue
            c.call_each_count()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a tactic that fails to run is not a winner
            errors[i] = f"{type(e).__name__}: {str(e)[:200]}"
            _recover(torch)
    if graph:
        for i in range(n):
            if errors[i] is not None:
                continue
            try:
                c.use(i)
                graphs[i] = [_capture(torch, c.call) for _ in range(max(1, instances))]
            except Exception as e:  # noqa: BLE001 - not capturable: every candidate runs eagerly
                _recover(torch)
                c.graph_fallback = f"{type(e).__name__}: {str(e)[:200]}"
                return errors, [None] * n, False
    return errors, graphs, graph


def _timed_rounds(torch, c: _Candidates, live: list[int], graphs: list, flush, delay, rounds: int, warmup: int,
                  seed: int, context=None) -> tuple[list[list[float]], list[list[int]] | None]:
    """Every live candidate once per round - each of its graph instances once - in a new random order
    each round; the samples (ms) and, with rotating input draws or several instances, the stratum of
    each (``draw * instances + instance``: ``settle.center`` takes the mean over strata)."""
    samples: list[list[float]] = [[] for _ in graphs]
    tags: list[list[int]] = [[] for _ in graphs]
    per = max((len(g) for g in graphs if g is not None), default=1)
    rng = random.Random(seed)
    for r in range(warmup + rounds):
        order = [(i, k) for i in live for k in range(len(graphs[i]) if graphs[i] is not None else 1)]
        rng.shuffle(order)
        draw = c.inputs_for_round(r)
        events = []
        for i, k in order:
            if graphs[i] is None and not c.use(i):
                continue
            if context is not None:
                context(c.tokens)
            if flush is not None:
                flush.zero_()
            if graphs[i] is None and delay is not None:
                # As FlashInfer's own tuner times eager calls: the stream waits in a delay
                # kernel while the host prepares the call, so the timed window holds the
                # kernels alone, not the host's argument handling and lookup.
                delay(EAGER_DELAY_US)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            if graphs[i] is not None:
                graphs[i][k].replay()
            else:
                c.call()
            end.record()
            events.append((i, k, start, end))
        torch.cuda.synchronize()
        if r >= warmup:
            for i, k, start, end in events:
                samples[i].append(start.elapsed_time(end))
                tags[i].append(draw * per + k)
    return samples, (tags if c.draws or c.strata or per > 1 else None)


def race(layer, bucket: int, assignments: list[dict], metadata: dict | None, *, rounds: int = 50, warmup: int = 5,
         cold_l2: bool = True, graph: bool = True, workdir: Path, seed: int = 0, keep_samples: bool = False,
         screen_rounds: int = 0, batch_rounds: int = 50, max_rounds: int = 0, keep: float = KEEP,
         keep_min: int = KEEP_MIN, confidence: float = CONFIDENCE, input_draws: int = 1,
         graph_instances: int = 1, span: list[int] | None = None, context=None) -> dict:
    """Every candidate ``rounds`` timed rounds; or, with ``screen_rounds``, a screen of every candidate
    and the close ones raced on until the fastest is settled (``settle.settle``: at least
    ``rounds``, at most ``max_rounds``), the graphs captured once for the whole race (``graph_instances``
    of each candidate, each timed every round: ``runs`` counts every timed run). ``span``: token counts
    of the bucket's range for an eager race, one a round (``_Candidates``); a graph race ignores it.
    ``context(tokens)``: run untimed before every timed run (module docstring)."""
    import torch
    from flashinfer.autotuner import AutoTuner, autotune

    device = torch.device("cuda", torch.cuda.current_device())
    n = len(assignments)
    # Every candidate sees every draw: a screened-out one keeps only its screen, and a time over fewer
    # draws than another's is not comparable (settle.center), so no more draws than the screen has rounds.
    cap = screen_rounds if screen_rounds > 0 else rounds
    span = span_within(span, cap) if span and not graph else None
    span = span if span and len(span) > 1 else None  # one count left: the bucket's, with its input draws
    input_draws = 1 if span else max(1, min(input_draws, cap))
    c = _Candidates(AutoTuner.get(), layer, bucket, assignments, metadata, workdir, input_draws, span)
    with autotune(False):
        errors, graphs, graph = _first_runs(torch, c, n, graph, graph_instances)
        context, context_error = _context_runs(torch, context, c.counts or [c.tokens])
        flush = None
        if cold_l2:
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
            flush = torch.empty(2 * l2, dtype=torch.uint8, device=device)
        live = [i for i in range(n) if errors[i] is None]
        delay = _delay_kernel() if not graph else None
        settled = None
        if screen_rounds > 0:
            def time_rounds(which, k, s):
                return _timed_rounds(torch, c, [i for i in which if i in live], graphs, flush, delay, k, warmup, s,
                                     context)

            samples, draws, settled = settle(time_rounds, n, rounds=rounds, screen_rounds=screen_rounds,
                                             batch_rounds=batch_rounds, max_rounds=max(max_rounds, rounds), keep=keep,
                                             keep_min=keep_min, confidence=confidence, seed=seed)
        else:
            samples, draws = _timed_rounds(torch, c, live, graphs, flush, delay, rounds, warmup, seed, context)
    c.remove()
    tags = draws or [None] * n
    # "medians_ms": the name the manifests and every reader know; with draws, settle.center's mean of medians
    out = {"bucket": bucket, "medians_ms": [center(s, t) for s, t in zip(samples, tags)],
           "relative_iqr": [relative_iqr(s, t) for s, t in zip(samples, tags)], "runs": [len(s) for s in samples],
           "errors": errors, "graph": bool(graph), "cold_l2": bool(cold_l2), "input_draws": max(1, len(c.draws)),
           "graph_instances": max(1, graph_instances) if graph else 1,
           **({"span": c.counts} if c.counts else {}),
           **({"graph_fallback": c.graph_fallback} if c.graph_fallback else {}),
           **({"context_error": context_error} if context_error else {}),
           **({"settle": settled} if settled else {})}
    if keep_samples:  # every timed run (ms), for a bootstrap of the ranking (tactic_exhaustive.py)
        out["samples_ms"] = samples
        out["samples_draw"] = draws
    return out


def run_spec(spec_path: str, build_layer) -> dict:
    """Race a spec file's candidates (careful's, ``careful.plan_races``) and write the result beside
    the spec, atomically. ``build_layer(index, op)`` is the worker's: the raced op's layer, and with a
    ``context`` in the spec its neighbours' (``context.py``), each the one its tunes used."""
    spec = json.loads(Path(spec_path).read_text())
    context = None
    if spec.get("context"):
        context = Neighbours([build_layer(n["layer"], n["op"]) for n in spec["context"]],
                             [n["op"]["id"] for n in spec["context"]], [n["op"].get("max_tokens") for n in spec["context"]])
    layer = build_layer(spec["layer"], spec["op"])  # last: the op in hand while the race loads kernel modules
    result = race(layer, spec["bucket"], spec["assignments"], spec["metadata"], workdir=Path(spec_path).parent,
                  seed=spec.get("seed", 0), context=context, **spec["settings"])
    out = Path(spec["result"])
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out)
    return result


def _context_runs(torch, context, counts: list[int]):
    """The context once at every count before any timed run: a neighbour that cannot run there (out
    of memory, a shape it refuses) races without it, said in the result, rather than failing the race."""
    if context is None:
        return None, None
    try:
        for m in counts:
            context(m)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - any failure of an untimed neighbour: race without the context
        _recover(torch)
        return None, f"{type(e).__name__}: {str(e)[:200]}"
    return context, None


def span_within(span: list[int], cap: int) -> list[int]:
    """At most ``cap`` of the span's counts, evenly spread, the bucket (the last) kept: every
    candidate sees every stratum, so no more strata than the screen has rounds."""
    if len(span) <= cap:
        return list(span)
    step = len(span) / cap
    return sorted({span[len(span) - 1 - int(k * step)] for k in range(cap)})


#: Stream delay before each eager timed call (FlashInfer's tuner uses 5000 us before a batch of
#: samples; one call's host work - argument handling, the cache lookup, launches - fits in 1 ms).
EAGER_DELAY_US = 1000


def _delay_kernel():
    """FlashInfer's stream delay kernel (what its autotuner queues before timed samples)."""
    try:
        from flashinfer.tllm_utils import delay_kernel
    except ImportError:
        return None
    return delay_kernel


def _capture(torch, call):
    """One call captured in a CUDA graph, as the engine captures its decode batches."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # warm-up on a side stream, as torch.cuda.graphs recommends
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call()
    torch.cuda.synchronize()
    return g


def _recover(torch) -> None:
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - a sticky error is the caller's to report
        pass

