"""The startup log lines ``doctor`` reads, as data: each one copied from the engine's own source.

A serving engine's log is the only witness of what it did at boot, so the parser must read what
the engine really prints and nothing else. Every entry below names the release and the
file:line in that release's wheel where the format string is (the full list, with the lines we
do not need, is ``tests/data/engine_logs/FORMATS.md``; ``tests/logs/test_formats.py`` holds the
two in step). A line that matches none of these is not interpreted: no format is guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The releases whose formats these are. A log naming another release is still read, with a
#: warning: the lines may have changed there.
UNDERSTOOD = {"sglang": "0.5.23", "vllm": "0.33.0", "flashinfer": "0.7.2.post1"}


@dataclass(frozen=True)
class LineFormat:
    """One message an engine logs: its name for the reader, where it is printed, its pattern."""

    name: str
    engine: str  # "sglang", "vllm", "flashinfer"
    source: str  # file:line in the wheel of UNDERSTOOD[engine]
    pattern: re.Pattern


def _f(name: str, engine: str, source: str, pattern: str) -> LineFormat:
    return LineFormat(name, engine, source, re.compile(pattern))


# --- line prefixes: who printed the line -----------------------------------------------------
#: SGLang: ``[%(asctime)s{.msecs}{prefix}] %(message)s``, datefmt ``%Y-%m-%d %H:%M:%S``
#: (sglang/srt/utils/common.py:2630,2636); prefix `` DP0 PP1 ATTN_CP0 MOE_DP0 TP3 EP3``
#: (sglang/srt/managers/scheduler.py:6279-6291).
SGLANG_PREFIX = re.compile(
    r"\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d{3})?(?P<rank>(?: (?:DP|PP|ATTN_CP|MOE_DP|TP|EP)\d+)*)\] ")
#: vLLM: ``(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d]
#: %(message)s``, datefmt ``%m-%d %H:%M:%S`` (vllm/logger.py:28-33); worker names ``Worker_DP0_PP0_TP3_EP3``
#: (vllm/v1/executor/multiproc_executor.py:1214-1227), ``EngineCore_DP0`` for a single-process engine.
VLLM_PREFIX = re.compile(
    r"\((?P<proc>[A-Za-z][\w.-]*) pid=(?P<pid>\d+)\) (?P<level>[A-Z]+) (?P<ts>\d\d-\d\d \d\d:\d\d:\d\d) "
    r"\[(?P<file>[^\]\s]+):(?P<lineno>\d+)\] ")
#: FlashInfer's own handler: ``%(asctime)s - %(levelname)s - %(filename)s:%(lineno)d - flashinfer.jit:
#: %(message)s`` (flashinfer/jit/core.py:68). It carries no rank.
FLASHINFER_PREFIX = re.compile(
    r"(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d{3} - (?P<level>[A-Z]+) - (?P<file>[\w.]+):(?P<lineno>\d+)"
    r" - flashinfer\.jit: ")
#: A tqdm bar of ``AutoTuner.choose_one``: ``tqdm.tqdm(total=len(profiles), initial=_step,
#: desc=f"[AutoTuner]: Tuning {custom_op}", unit="profile")`` (flashinfer/autotuner/autotuner.py:2400-2406),
#: rendered by tqdm's ``format_meter``: ``{desc}: {pct:3.0f}%|{bar}| {n}/{total} [{elapsed}<{remaining},
#: {rate}]``. Printed by tqdm to stderr, not through logging: no prefix, no rank.
TQDM_BAR = re.compile(
    r"\[AutoTuner\]: Tuning (?P<op>\S+): +(?P<pct>\d+)%\|[^|]*\| (?P<n>\d+)/(?P<total>\d+) "
    r"\[(?P<elapsed>(?:\d+:)?\d+:\d\d)<(?P<remaining>[^,\]]*),(?P<rate>[^\]]*)\]")  # rate: the reader strips it

# --- messages ----------------------------------------------------------------------------------
# Every pattern runs in time linear in the line (a log line may be megabytes: tqdm's redraws, a
# hostile file): no lazy quantifier, no unbounded repeat inside another, and a field that runs up
# to a delimiter is a run of characters that are not the delimiter's start, or that start and not
# the whole delimiter (``_upto``) - one way to read each character, nothing to backtrack into.
# tests/logs/test_linear_patterns.py counts the work on megabyte lines of each one's worst case.

#: A field to the end of the line, less trailing whitespace (a path that is only whitespace keeps
#: its first character, as ``.+?\s*$`` did): a greedy run backs off once, to the last non-space.
_TO_EOL = r"(?P<path>.*\S|.)\s*$"
_PASS = r"\. Pass --disable-flashinfer-autotune"


def _upto(name: str, delimiter: str, repeat: str = "*") -> str:
    """A field named ``name`` running up to the first ``delimiter`` (a regex of fixed text whose
    first character is a literal), then the delimiter: each character is either not the
    delimiter's first one, or is and does not start the whole delimiter (a lookahead of fixed
    length). The same text ``(?P<name>.*?)delimiter`` matches, without its backtracking."""
    first = delimiter[:2] if delimiter.startswith("\\") else delimiter[0]
    rest = delimiter[len(first):]
    return f"(?P<{name}>(?:[^{first}]|{first}(?!{rest})){repeat}){delimiter}"


_SG = "sglang/srt/model_executor/runner/flashinfer_autotune.py"
_AT = "flashinfer/autotuner/autotuner.py"
_AC = "flashinfer/autotune_cache.py"
_VW = "vllm/model_executor/warmup/kernel_warmup.py"
_ST = "vllm/entrypoints/common/startup.py"

MESSAGES: tuple[LineFormat, ...] = (
    _f("sglang.cache", "sglang", f"{_SG}:304", rf"^Running FlashInfer autotune with cache: {_TO_EOL}"),
    _f("sglang.reuse_disabled", "sglang", f"{_SG}:313",
       r"^Running FlashInfer autotune \(cache reuse DISABLED via SGLANG_FLASHINFER_AUTOTUNE_CACHE=0\); "
       rf"writing fresh result to: {_TO_EOL}"),
    _f("sglang.diverged", "sglang", f"{_SG}:283",
       r"^FlashInfer autotune: per-rank caches disagree, discarding them and tuning from scratch"),
    _f("sglang.completed", "sglang", f"{_SG}:369", r"^FlashInfer autotune completed\.\s*$"),
    _f("sglang.server_args", "sglang", "sglang/srt/entrypoints/engine.py:311,1185",
       r"^server_args=(?P<args>\{.*\})\s*$"),
    _f("flashinfer.start", "flashinfer", f"{_AT}:1048", r"^\[Autotuner\]: Autotuning process starts"),
    _f("flashinfer.end", "flashinfer", f"{_AT}:1071", r"^\[Autotuner\]: Autotuning process ends"),
    _f("flashinfer.hit", "flashinfer", f"{_AT}:2020,2065",
       r"^\[Autotuner\]: Config cache hit for (?P<op>\S+) \(runner=(?P<runner>[^,]+), "
       r"source=(?P<source>config file|managed cache)\)"),
    _f("flashinfer.loaded", "flashinfer", f"{_AT}:3815", rf"^\[Autotuner\]: Loaded (?P<n>\d+) configs from {_TO_EOL}"),
    _f("flashinfer.other_env", "flashinfer", f"{_AT}:3769",
       r"^\[Autotuner\]: Cache file " + _upto("path", " was created in a different environment \\(", "+")
       + _upto("diff", "\\)\\. Ignoring cached configs\\.")),
    _f("flashinfer.not_saving", "flashinfer", f"{_AT}:3585",
       r"^\[Autotuner\]: Not saving configs to " + _upto("path", ": the file was created in a different environment", "+")),
    _f("flashinfer.saved", "flashinfer", f"{_AT}:3673",
       r"^\[Autotuner\]: Saved (?P<n>\d+) configs to (?P<path>.+) \((?P<new>\d+) new, (?P<prev>\d+) from previous"),
    _f("flashinfer.uncovered", "flashinfer", f"{_AT}:2294",
       r"^\[AutoTuner\]: No tuned config covers (?P<op>\S+) input_shapes=" + _upto("shapes", "; falling back")),
    _f("flashinfer.attached", "flashinfer", f"{_AC}:496,449",
       r"^\[Autotuner\]: Managed autotune cache attached for this process: "
       r"ManagedAutotuneCache\(env_dir='(?P<env_dir>[^']+)'"),
    _f("flashinfer.preloaded", "flashinfer", f"{_AC}:529",
       r"^\[Autotuner\]: Preloaded (?P<n>\d+)/(?P<total>\d+) managed cache entries into memory"),
    _f("vllm.version", "vllm", "vllm/v1/engine/core.py:140", r"^Initializing a V1 LLM engine \(v(?P<version>[^)\s]+)\)"),
    # The API server's first line (log_version_and_model): plain where the logo is off or no
    # formatter is known, else a four-line logo whose second line ends "version X". vLLM's
    # NewLineFormatter writes each line of it behind the record's own prefix, so it is a line here.
    _f("vllm.server_version", "vllm", f"{_ST}:18,38",
       r"^vLLM server version (?P<version>[^,\s]+), serving model "),
    _f("vllm.logo_version", "vllm", f"{_ST}:22,38",
       r"^ ?▄▄ ▄█ █ +█ +█ ▀▄▀ █ +version (?P<version>\S+)\s*$"),
    _f("vllm.args", "vllm", f"{_ST}:96", r"^non-default args: (?P<args>\{.*\})\s*$"),
    _f("vllm.cache_file", "vllm", f"{_VW}:497",
       r"^Using FlashInfer autotune cache file: " + _upto("path", _PASS, "+")),
    _f("vllm.managed", "vllm", f"{_VW}:486",
       r"^Using FlashInfer managed autotune cache \(root=" + _upto("root", "\\)" + _PASS, "+")),
    _f("vllm.running", "vllm", f"{_VW}:372",
       r"^Running FlashInfer autotune with (?P<tokens>\d+) tokens and token buckets (?P<buckets>\[.*\])\.\s*$"),
    _f("vllm.disabled", "vllm", f"{_VW}:270", r"^Skipping FlashInfer autotune because it is disabled\."),
)

PREFIXES = (("sglang", "sglang/srt/utils/common.py:2630", SGLANG_PREFIX),
            ("vllm", "vllm/logger.py:28", VLLM_PREFIX),
            ("flashinfer", "flashinfer/jit/core.py:68", FLASHINFER_PREFIX))


def match_message(engine: str, message: str) -> tuple[str, dict[str, str]] | None:
    """(format name, its fields) for a message printed under ``engine``'s prefix, or None.
    FlashInfer's messages also reach an engine's handlers (root propagation), so an engine line
    is matched against its own formats and FlashInfer's."""
    for fmt in MESSAGES:
        if fmt.engine in (engine, "flashinfer") and (m := fmt.pattern.search(message)):
            return fmt.name, m.groupdict()
    return None


def seconds(interval: str) -> int:
    """tqdm's ``format_interval`` back to seconds: ``00:27`` -> 27, ``1:01:40`` -> 3700."""
    total = 0
    for part in interval.split(":"):
        total = total * 60 + int(part)
    return total
