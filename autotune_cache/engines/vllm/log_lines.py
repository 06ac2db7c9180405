"""vLLM 0.33's startup log, as ``doctor`` reads it: its line prefix (the worker's process name is
the rank), its version and ``non-default args`` lines, the lines of its kernel warm-up's
autotune pass (``flashinfer_autotune``), and how its ranks behave there: only the leader names
the cache (``info_once``), each worker reads its own file in that directory, all tune in step,
and no line ends the pass.

Each format names the file:line in vLLM 0.33.0's wheel where its string is
(``tests/data/engine_logs/FORMATS.md`` lists them with the lines we do not need)."""

from __future__ import annotations

import re

from autotune_cache.logs.dialect import LineFormat, LogDialect, Server, line_format, upto

#: ``(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d]
#: %(message)s``, datefmt ``%m-%d %H:%M:%S`` (vllm/logger.py:28-33); worker names ``Worker_DP0_PP0_TP3_EP3``
#: (vllm/v1/executor/multiproc_executor.py:1214-1227), ``EngineCore_DP0`` for a single-process engine.
VLLM_PREFIX = re.compile(
    r"\((?P<proc>[A-Za-z][\w.-]*) pid=(?P<pid>\d+)\) (?P<level>[A-Z]+) (?P<ts>\d\d-\d\d \d\d:\d\d:\d\d) "
    r"\[(?P<file>[^\]\s]+):(?P<lineno>\d+)\] ")
#: The per-rank file name (vllm/model_executor/warmup/flashinfer_autotune_cache.py:57-59).
RANK_FILE = re.compile(r"autotune_configs_dp(\d+)_rank(\d+)\.json$")

_VW = "vllm/model_executor/warmup/kernel_warmup.py"
_ST = "vllm/entrypoints/common/startup.py"
_PASS = r"\. Pass --disable-flashinfer-autotune"

_MESSAGES: tuple[LineFormat, ...] = (
    line_format("vllm.version", "server.version", "vllm/v1/engine/core.py:140",
                r"^Initializing a V1 LLM engine \(v(?P<version>[^)\s]+)\)"),
    # The API server's first line (log_version_and_model): plain where the logo is off or no
    # formatter is known, else a four-line logo whose second line ends "version X". vLLM's
    # NewLineFormatter writes each line of it behind the record's own prefix, so it is a line here.
    line_format("vllm.server_version", "server.version", f"{_ST}:18,38",
                r"^vLLM server version (?P<version>[^,\s]+), serving model "),
    line_format("vllm.logo_version", "server.version", f"{_ST}:22,38",
                r"^ ?▄▄ ▄█ █ +█ +█ ▀▄▀ █ +version (?P<version>\S+)\s*$"),
    line_format("vllm.args", "server.args", f"{_ST}:96", r"^non-default args: (?P<args>\{.*\})\s*$"),
    line_format("vllm.cache_file", "pass.open", f"{_VW}:497",
                r"^Using FlashInfer autotune cache file: " + upto("path", _PASS, "+")),
    line_format("vllm.managed", "pass.open_managed", f"{_VW}:486",
                r"^Using FlashInfer managed autotune cache \(root=" + upto("root", "\\)" + _PASS, "+")),
    line_format("vllm.running", "pass.dummy", f"{_VW}:372",
                r"^Running FlashInfer autotune with (?P<tokens>\d+) tokens and token buckets (?P<buckets>\[.*\])\.\s*$"),
    line_format("vllm.disabled", "autotune.off", f"{_VW}:270", r"^Skipping FlashInfer autotune because it is disabled\."),
)

_WORKER_TOKEN = re.compile(r"_(DP|PP|PCP|TP|DCP|EP)(\d+)")


def _worker_tokens(label: str) -> dict[str, int]:
    """``Worker_DP1_TP3_EP3`` -> ``{"DP": 1, "TP": 3, "EP": 3}`` (vLLM's worker process names,
    multiproc_executor.py:1214-1227)."""
    return {k: int(v) for k, v in _WORKER_TOKEN.findall(label)} if label.startswith("Worker") else {}


def _positive(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n > 0


def tp_size(server: Server) -> int | None:
    """The server's TP size: as its ``non-default args`` state it, else as its workers' names
    show it where they show PP stages too; None where it is not known (no pipeline stages
    shown: a world rank is then the TP rank)."""
    tp = (server.server_args or {}).get("tensor_parallel_size")
    if _positive(tp):
        return tp
    tokens = [_worker_tokens(r) for r in server.ranks]
    if any("PP" in t for t in tokens):
        return 1 + max(t.get("TP", 0) for t in tokens)
    return None


def rank_label(server: Server, dp: int, rank: int) -> str:
    """The name vLLM gives the worker that reads ``autotune_configs_dp{dp}_rank{rank}.json``
    (its rank in the engine's world group: PP stage x TP size + TP rank), so a rank is one label
    whether its lines or only its file are seen: the worker's own name where it spoke, else the
    name vLLM gives it, shaped like its siblings' (``Worker_TP1``, ``Worker_TP1_EP1``)."""
    size = tp_size(server)
    pp, tp = divmod(rank, size) if size else (0, rank)
    size = size or 1 + max(rank, *(_worker_tokens(r).get("TP", 0) for r in server.ranks))
    named = [r for r in server.ranks if _worker_tokens(r)]
    for r in named:
        t = _worker_tokens(r)
        if t.get("DP", dp) == dp and t.get("PP", 0) == pp and t.get("TP", 0) == tp:
            return r
    shape = _worker_tokens(named[0]) if named else {"TP": 0}
    parts = {"DP": dp, "PP": pp, "TP": tp, "EP": dp * size + tp}
    label = "Worker" + "".join(f"_{k}{parts[k]}" for k in ("DP", "PP", "TP", "EP")
                               if k in shape or (k == "DP" and dp) or (k == "PP" and pp))
    return label if label != "Worker" else ("Worker_TP0" if not named and rank == 0 else f"Worker_{rank}")


def world_size(server: Server) -> int:
    """How many ranks of a server tune: its workers seen (by name or by file), or as many as its
    ``non-default args`` state (TP x PP x DP), whichever is more."""
    args = server.server_args or {}
    world = 1
    for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        world *= args[k] if _positive(args.get(k)) else 1
    return max(world, len(server.ranks))


class VllmLines(LogDialect):
    name = "vllm"
    label = "vLLM"
    release = "0.33.0"
    prefix = VLLM_PREFIX
    prefix_source = "vllm/logger.py:28"
    formats = _MESSAGES
    default_root = ".cache/vllm"
    command_placeholder = "vllm serve <the server's flags>"
    key_option = "--vllm-config-hash"
    opaque_key_note = "vLLM's config hash differs (only vLLM computes it: warm with the server's own --vllm-config-hash)"
    passes_end_with_log = True
    leader_names_cache = True
    ranks_in_lockstep = True

    def rank_of(self, prefix: re.Match) -> str | None:
        return prefix["proc"]

    def rank_of_file(self, server: Server, path: str) -> tuple[str, bool] | None:
        m = RANK_FILE.search(path)
        return (rank_label(server, int(m[1]), int(m[2])), m[2] == "0") if m else None

    def lockstep_ranks(self, server: Server) -> int:
        return world_size(server)


DIALECT = VllmLines()
