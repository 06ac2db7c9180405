"""doctor's line patterns run in time linear in the line (issue 44: a 100,000-space cache line took
42 s under the lazy ``.+?\\s*$`` patterns, a line repeating "was created in a different environment ("
49 s).

The work is counted, not timed: ``tests/support/regex_steps.py`` runs each pattern in a model of
sre's backtracking and counts the nodes tried. Each pattern meets a family of hostile lines (its
own head, then any of its literal pieces or a filler repeated to the length), and must stay under
``STEPS_PER_CHAR`` steps per character, at two lengths whose work grows by the same factor as the
length. The real engine then reads one-megabyte lines of each pattern's worst case found, and the
whole of doctor's line reader a megabyte of each, in a child process under a deadline (a
regression fails rather than hangs; the time itself is benchmarks/doctor_throughput.py's)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest

from autotune_cache.engines.sglang.log_lines import SGLANG_PREFIX
from autotune_cache.engines.vllm.log_lines import VLLM_PREFIX
from autotune_cache.logs import formats, library, reader
from tests.support.regex_steps import C, P, steps

from ..conftest import REPO

#: Work allowed per character of a hostile line: a linear pattern stays near 1-10 here (a
#: lookahead of a delimiter's length at each of its first characters); a quadratic one is in the
#: hundreds by a kilobyte.
STEPS_PER_CHAR = 64

#: (pattern, a line it matches, whether sub/finditer scans it for every match)
SAMPLES = {
    "sglang.cache": "Running FlashInfer autotune with cache: /r/flashinfer/autotune/0.7.2/sm90/abc/rank_tp0_pp0_dp0.json",
    "sglang.reuse_disabled": "Running FlashInfer autotune (cache reuse DISABLED via SGLANG_FLASHINFER_AUTOTUNE_CACHE=0); "
                             "writing fresh result to: /r/x.json",
    "sglang.diverged": "FlashInfer autotune: per-rank caches disagree, discarding them and tuning from scratch so",
    "sglang.completed": "FlashInfer autotune completed.",
    "sglang.server_args": "server_args={'model_path': 'Qwen/Qwen3-30B-A3B', 'tp_size': 2}",
    "flashinfer.start": "[Autotuner]: Autotuning process starts ...",
    "flashinfer.end": "[Autotuner]: Autotuning process ends",
    "flashinfer.hit": "[Autotuner]: Config cache hit for trtllm::fused_moe::gemm1 (runner=MoERunner, source=config file)",
    "flashinfer.loaded": "[Autotuner]: Loaded 42 configs from /tmp/x/rank_tp0_pp0_dp0.json",
    "flashinfer.other_env": "[Autotuner]: Cache file /c/x.json was created in a different environment (cuda: saved=12.8 "
                            "vs current=12.9). Ignoring cached configs. Tuning again.",
    "flashinfer.not_saving": "[Autotuner]: Not saving configs to /c/x.json: the file was created in a different environment",
    "flashinfer.saved": "[Autotuner]: Saved 42 configs to /c/x.json (2 new, 40 from previous config)",
    "flashinfer.uncovered": "[AutoTuner]: No tuned config covers trtllm::fused_moe::gemm1 input_shapes=[(1, 2)]; "
                            "falling back to runner=x tactic=-1.",
    "flashinfer.attached": "[Autotuner]: Managed autotune cache attached for this process: "
                           "ManagedAutotuneCache(env_dir='/c/v2/0123', hits=0, misses=0)",
    "flashinfer.preloaded": "[Autotuner]: Preloaded 42/42 managed cache entries into memory",
    "vllm.version": "Initializing a V1 LLM engine (v0.33.0) with config: ...",
    "vllm.cache_file": "Using FlashInfer autotune cache file: /c/autotune_configs_dp0_rank0.json. "
                       "Pass --disable-flashinfer-autotune to skip autotuning.",
    "vllm.managed": "Using FlashInfer managed autotune cache (root=flashinfer default). Pass --disable-flashinfer-autotune",
    "vllm.running": "Running FlashInfer autotune with 8192 tokens and token buckets [1, 2, 4, 8192].",
    "vllm.disabled": "Skipping FlashInfer autotune because it is disabled.",
    "vllm.server_version": "vLLM server version 0.33.0, serving model Qwen/Qwen3-30B-A3B",
    "vllm.logo_version": " ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.33.0",
    "vllm.args": "non-default args: {'model_tag': 'Qwen/Qwen3-30B-A3B', 'tensor_parallel_size': 2}",
    "prefix.sglang": "[2026-06-29 01:38:00.123 DP0 TP3 EP3] ",
    "prefix.vllm": "(Worker_TP0 pid=4242) INFO 06-29 01:38:00 [kernel_warmup.py:496] ",
    "prefix.flashinfer": "2026-06-29 01:38:00,123 - INFO - autotuner.py:3814 - flashinfer.jit: ",
    "tqdm": "[AutoTuner]: Tuning trtllm::fused_moe::gemm1: 100%|##########| 21/21 [00:27<00:00,  1.30s/profile]",
    "reader.outer_ts": "pod/sglang-0 2026-06-29T01:38:00.123456Z ",
    "reader.ansi": "\x1b[31;1m",
    "reader.bar_start": "[AutoTuner]: Tuning trtllm::fused_moe::gemm1:  52%",
}

PATTERNS = {**{f.name: f.pattern for d in formats.dialects() for f in d.formats},
            "prefix.sglang": SGLANG_PREFIX, "prefix.vllm": VLLM_PREFIX,
            "prefix.flashinfer": library.FLASHINFER_PREFIX, "tqdm": library.TQDM_BAR,
            "reader.outer_ts": reader._OUTER_TS, "reader.ansi": reader._ANSI, "reader.bar_start": library.BAR_START}
#: Scanned for every match (``sub``, ``finditer``), not searched once.
EVERY = {"tqdm", "reader.outer_ts", "reader.ansi", "reader.bar_start"}

#: Repeats nested in repeats that are linear all the same, and why.
NESTED_OK = {
    # each rank item starts with a space its digits do not hold, and its digits end where a space or
    # "]" starts: one way to read the run, nothing to backtrack into
    "prefix.sglang",
}


def test_every_pattern_has_a_sample_it_matches():
    assert set(SAMPLES) == set(PATTERNS)
    for name, pattern in PATTERNS.items():
        assert pattern.search(SAMPLES[name]), name


def _walk(tree, inside_repeat=False):
    """(op, unbounded, inside an unbounded repeat) of every node."""
    for op, av in tree:
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            unbounded = av[1] == C.MAXREPEAT
            yield op, unbounded, inside_repeat
            yield from _walk(av[2], inside_repeat or unbounded)
        elif op is C.SUBPATTERN:
            yield from _walk(av[-1], inside_repeat)
        elif op is C.BRANCH:
            for alt in av[1]:
                yield from _walk(alt, inside_repeat)
        elif op in (C.ASSERT, C.ASSERT_NOT):
            yield from _walk(av[1], inside_repeat)


@pytest.mark.parametrize("name", list(PATTERNS))
def test_no_lazy_quantifier_and_no_unbounded_repeat_in_another(name):
    nodes = list(_walk(P.parse(PATTERNS[name].pattern, PATTERNS[name].flags)))
    assert not [op for op, _, _ in nodes if op is C.MIN_REPEAT], f"{name}: a lazy quantifier"
    if name not in NESTED_OK:
        assert not [1 for _, unbounded, inside in nodes if unbounded and inside], f"{name}: a repeat in a repeat"


def _literals(pattern) -> list[str]:
    """The pattern's runs of literal characters (its delimiters), longest first."""
    runs, cur = [], []

    def walk(tree):
        for op, av in tree:
            if op is C.LITERAL:
                cur.append(chr(av))
                continue
            if cur:
                runs.append("".join(cur))
                cur.clear()
            if op is C.SUBPATTERN:
                walk(av[-1])
            elif op in (C.MAX_REPEAT, C.MIN_REPEAT):
                walk(av[2])
            elif op is C.BRANCH:
                for alt in av[1]:
                    walk(alt)
            elif op in (C.ASSERT, C.ASSERT_NOT):
                walk(av[1])
    walk(P.parse(pattern.pattern, pattern.flags))
    if cur:
        runs.append("".join(cur))
    return sorted(set(runs), key=len, reverse=True)


def hostile_lines(name: str, length: int) -> dict[str, str]:
    """The family: the sample cut where each of its fields starts, then a piece repeated to
    ``length`` characters - a delimiter of the pattern (whole, less its last character, or with a
    filler after it) or a filler alone - ending there or in one other character."""
    pattern, sample = PATTERNS[name], SAMPLES[name]
    m = pattern.search(sample)
    cuts = sorted({0, m.start(), *(m.start(g) for g in range(1, (pattern.groups or 0) + 1) if m.start(g) >= 0)})
    pieces = {" ", "x", "1", "\t"}
    for lit in _literals(pattern)[:8]:
        pieces |= {lit, lit[:-1] or lit, lit + " ", lit + "x", lit + "1"}
    lines = {}
    for cut in cuts:
        head = sample[:cut]
        for piece in sorted(pieces):
            body = piece * (max(0, length - len(head)) // len(piece) + 1)
            lines[f"{head!r} + {piece!r}*"] = (head + body)[:length]
            lines[f"{head!r} + {piece!r}* + 'x'"] = (head + body)[:length - 1] + "x"  # the run ends in another
    return lines


@pytest.mark.parametrize("name", list(PATTERNS))
def test_work_is_linear_on_every_hostile_line(name):
    """Under ``STEPS_PER_CHAR`` at 500 characters, for every member of the family; the worst
    member grows 4x (not 16x) at 2,000."""
    pattern, every = PATTERNS[name], name in EVERY
    per_char = {what: steps(pattern, line, every) / len(line) for what, line in hostile_lines(name, 500).items()}
    worst = max(per_char, key=per_char.get)
    assert per_char[worst] < STEPS_PER_CHAR, f"{name}: {per_char[worst]:.0f} steps per character on {worst}"
    small, big = hostile_lines(name, 500)[worst], hostile_lines(name, 2000)[worst]
    assert steps(pattern, big, every) <= 5 * steps(pattern, small, every), f"{name}: superlinear on {worst}"


def test_the_measure_sees_the_old_patterns_quadratic_work():
    """The counter is not blind: the patterns this replaced are quadratic under it."""
    old_cache = re.compile(r"^Running FlashInfer autotune with cache: (?P<path>.+?)\s*$")
    old_ts = re.compile(r"\s*\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s*")
    head = "Running FlashInfer autotune with cache: /p"
    # 4x the line, 16x the work (a linear pattern's grows 4x): measured where the quadratic work is
    # still small enough to count quickly
    assert steps(old_cache, head + " " * 400 + "x") > 10 * steps(old_cache, head + " " * 100 + "x")
    assert steps(old_ts, " " * 400, every=True) > 10 * steps(old_ts, " " * 100, every=True)


_MEGABYTE_CHILD = textwrap.dedent("""
    import json, sys
    from autotune_cache.logs.reader import read_log
    from tests.logs.test_linear_patterns import EVERY, PATTERNS, hostile_lines, steps
    MB = 1 << 20
    for name, pattern in PATTERNS.items():
        family = hostile_lines(name, 1000)
        worst = max(family, key=lambda w: steps(pattern, family[w], name in EVERY))
        line = hostile_lines(name, MB)[worst]
        list(pattern.finditer(line)) if name in EVERY else pattern.search(line)
        read_log("hostile.log", line + "\\n")  # the whole reader: prefixes, bars, every message pattern
        print(json.dumps([name, worst]), flush=True)
""")


@pytest.mark.slow  # about 20 s: CI's second pass (`-m slow`) runs it; the step counts above run every time
def test_a_megabyte_line_of_each_worst_case_is_read_in_the_real_engine():
    """Each pattern's worst hostile line found above, at 1 MiB, through ``re`` itself and through
    doctor's line reader; a quadratic pattern would take tens of minutes here, not the deadline."""
    proc = subprocess.run([sys.executable, "-c", _MEGABYTE_CHILD], capture_output=True, text=True, cwd=REPO,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {json.loads(line)[0] for line in proc.stdout.splitlines()} == set(PATTERNS)


def test_diagnosis_reads_each_bar_a_bounded_number_of_times(monkeypatch):
    """doctor's diagnosis grows with the log, not with passes x bars: the server's rank-less bars
    are read once per server, not once per session that saw them (a log of many passes was
    quadratic: 1 MB of concatenated fixtures took 4.5 CPU-s, now 0.35)."""
    from pathlib import Path

    from autotune_cache.logs import diagnose as d

    read = []
    real = d._ops
    monkeypatch.setattr(d, "_ops", lambda bars: read.append(len(bars)) or real(bars))
    text = "".join(p.read_text() for p in sorted((REPO / "tests" / "data" / "engine_logs").glob("*.log")))
    work = []
    for copies in (4, 16):
        read.clear()
        d.diagnose([("x.log", text * copies)], [])
        work.append(sum(read) + len(read))
    assert work[1] <= 5 * work[0], work  # 4x the log, about 4x the bars read (16x before)
