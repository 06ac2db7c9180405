"""SGLang 0.5.23 set up on a fake GPU, for the oracle scripts in this folder.

Run only in an interpreter that has sglang==0.5.23 (installed --no-deps, see README.md here).
``boot`` must come before any sglang import: SGLang decides backends at import time from the
GPU it sees. ``resolve`` runs SGLang's own argument parser and resolution pipeline on a
serving command; ``ModelRunnerView`` carries what a ``ModelRunner`` would hold at the point
SGLang decides whether and how to autotune, built by SGLang's own ``ModelConfig``.

Model paths: a command's ``--model-path org/name`` is served as a *relative* directory under a
temporary working directory holding the config (and ModelOpt sidecar) fi-autotune ships, so the
string SGLang hashes into the key is exactly the one in the command, as for a hub id, and nothing
is downloaded.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cudastubs  # noqa: E402
import fakegpu  # noqa: E402

#: Every read of a resolved config leaf after ``trace_reads`` starts: (namespace path, leaf).
READS: set[tuple[str, str]] = set()
_tracing = [False]


def boot(arch: str, gpus: int = 8, workdir: str | None = None) -> Path:
    """Fake GPU + stub kernels + a private working directory (SGLANG_CACHE_DIR inside it)."""
    cudastubs.install()
    fakegpu.install(arch, gpus)
    work = Path(workdir or tempfile.mkdtemp(prefix="sglang-oracle-"))
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)
    os.environ["SGLANG_CACHE_DIR"] = str(work / "cache")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    return work


def materialize_models(models: dict[str, dict]) -> None:
    """``{"org/name": {"config": path, "sidecar": path | None}}`` -> ./org/name/config.json (+ sidecar)."""
    for served, files in models.items():
        d = Path(served)
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(files["config"], d / "config.json")
        if files.get("sidecar"):
            shutil.copyfile(files["sidecar"], d / "hf_quant_config.json")
        write_remote_code(d)


def write_remote_code(d: Path) -> None:
    """``--trust-remote-code`` loads the config class config.json's ``auto_map`` names from the
    checkpoint's own module (e.g. ``configuration_deepseek.DeepseekV3Config``). Only the class
    *name* reaches the cache key, and config.json states it; the module here defines that class
    over transformers' PretrainedConfig with the config's model_type, so SGLang's code runs as
    it would with the checkpoint's module, without that module's code."""
    cfg = json.loads((d / "config.json").read_text())
    target = (cfg.get("auto_map") or {}).get("AutoConfig")
    if not target or "." not in target:
        return
    module, cls = target.rsplit(".", 1)
    # Over transformers' own class for the model type where it has one (its defaults, e.g.
    # pad_token_id, are what the checkpoint's module also sets), else over PretrainedConfig.
    (d / f"{module}.py").write_text(
        "from transformers import PretrainedConfig\n"
        "from transformers.models.auto.configuration_auto import CONFIG_MAPPING\n\n"
        f"_base = CONFIG_MAPPING[{cfg.get('model_type')!r}] if {cfg.get('model_type')!r} in CONFIG_MAPPING "
        "else PretrainedConfig\n\n\n"
        f"class {cls}(_base):\n    model_type = {cfg.get('model_type')!r}\n")


def resolve(argv: list[str], env: dict[str, str] | None = None):
    """SGLang's prepare_server_args + resolve_once on ``argv`` (the flags after the launcher)."""
    for k, v in (env or {}).items():
        os.environ[k] = v
    from sglang.srt.server_args import prepare_server_args

    sa = prepare_server_args(list(argv))
    logging.disable(logging.WARNING)
    sa.resolve_once()
    logging.disable(logging.NOTSET)
    return sa


def trace_reads() -> None:
    """Record every resolved-config leaf read through the runtime context from now on."""
    from sglang.srt import runtime_context as rc

    if _tracing[0]:
        return
    _tracing[0] = True
    original = rc._ConfigBag.__getattribute__

    def traced(self, name):
        value = original(self, name)
        if not name.startswith("_"):
            try:
                fields = object.__getattribute__(self, "_fields")
            except AttributeError:
                return value
            if name in fields:
                READS.add((object.__getattribute__(self, "_path"), name))
        return value

    rc._ConfigBag.__getattribute__ = traced
    original_read = rc.ParallelContext._read

    def traced_read(self, name):
        READS.add(("parallel", name))
        return original_read(self, name)

    rc.ParallelContext._read = traced_read


def publish(sa, *, tp_rank: int = 0, pp_rank: int = 0, dp_rank: int | None = None, gpu_id: int = 0):
    """What the launcher publishes for one scheduler process (managers/scheduler.py run_scheduler_process)."""
    from sglang.srt.runtime_context import SpawnRanks, publish as _publish, spawn_world_rank

    context = _publish(sa, role="scheduler", ranks=SpawnRanks(
        world_rank=spawn_world_rank(sa, tp_rank=tp_rank, pp_rank=pp_rank), dp_rank=dp_rank, gpu_id=gpu_id))
    init_moe_gemm_config(sa)
    return context


def init_moe_gemm_config(sa) -> None:
    """What Scheduler.init_moe_gemm_config does before the model runner exists: the MoE
    backend globals (for MoE models) and the FP8 / FP4 / BF16 dense GEMM backends, which
    should_run_flashinfer_autotune and the linear layers read (managers/scheduler.py)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.moe import initialize_moe_config
    from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
    from sglang.srt.layers.quantization.unquant import initialize_bf16_gemm_config

    text = ModelConfig.from_server_args(sa).hf_text_config
    if any(hasattr(text, a) for a in ("num_experts_per_tok", "num_experts_per_token", "top_k_experts",
                                      "moe_top_k", "moe_topk")):
        initialize_moe_config()
    initialize_fp8_gemm_config()
    initialize_fp4_gemm_config()
    initialize_bf16_gemm_config()


def launcher_ranks(sa) -> list[dict]:
    """(tp, pp, dp) of every scheduler process, as data_parallel_controller.py and launch_server
    spawn them: with attention DP, dp_rank is the attention-DP rank of the TP rank; with plain DP,
    each replica has its own TP group and its index; with neither, None."""
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.layers.dp_attention import compute_dp_attention_world_info
    from sglang.srt.runtime_context import attn_dp_enabled_of, num_dp_ranks_of

    cfg = resolving_view(sa)
    out = []
    attn_dp = attn_dp_enabled_of(cfg)
    replicas = 1 if attn_dp else num_dp_ranks_of(cfg)
    for replica in range(replicas):
        for pp in range(cfg.pp_size):
            for tp in range(cfg.tp_size):
                if attn_dp:
                    dp = compute_dp_attention_world_info(tp, cfg.tp_size, cfg.attn_dp_size, cfg.attn_cp_size)[2]
                else:
                    dp = replica if replicas > 1 else None
                out.append({"tp": tp, "pp": pp, "dp": dp})
    return out


class _Pool:
    def __init__(self, size: int):
        self.size = size


class _NoModules:
    """The model before weights: ``modules()`` is empty, so SGLang's block-FP8-as-MXFP8 scan
    finds no layer (the oracle reports ``can_serve_block_fp8_as_mxfp8`` separately)."""

    shared_experts_config = None

    def modules(self):
        return iter(())


class ModelRunnerView:
    """The ModelRunner attributes SGLang's autotune gate, cache path and dummy-pass sizing read.

    ``model_config`` is SGLang's own ``ModelConfig.from_server_args`` (the draft's with
    ``is_draft_model=True`` and the draft path), ``spec_algorithm`` SGLang's own parse of the
    flag. ``pool_size`` is the request pool (``req_to_token_pool.size``): SGLang sizes it from the
    KV-cache memory it profiles at startup, which no CPU can know; ``request_pool_size`` below
    applies SGLang's own rule to a stated token capacity.
    """

    device = "cuda"

    def __init__(self, sa, *, is_draft_worker: bool = False, pool_size: int = 4096, gpu_id: int = 0):
        from sglang.srt.arg_groups.overrides import resolving_view
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        cfg = resolving_view(sa)
        self.server_args = sa
        self.is_draft_worker = is_draft_worker
        self.gpu_id = gpu_id
        if is_draft_worker:
            self.model_config = ModelConfig.from_server_args(
                sa, model_path=cfg.speculative_draft_model_path,
                model_revision=cfg.speculative_draft_model_revision, is_draft_model=True)
        else:
            self.model_config = ModelConfig.from_server_args(sa)
        self.dtype = self.model_config.dtype
        self.spec_algorithm = SpeculativeAlgorithm.from_string(cfg.speculative_algorithm)
        self.req_to_token_pool = _Pool(pool_size)
        self.model = _NoModules()
        self.is_generation = True
        self.max_running_requests = pool_size

    def decode_num_tokens_per_req(self, *, num_draft_tokens=None):
        from sglang.srt.model_executor.model_runner import ModelRunner

        return ModelRunner.decode_num_tokens_per_req(self, num_draft_tokens=num_draft_tokens)


def request_pool_size(sa, token_capacity: int) -> int:
    """kv_cache_configurator.py resolve_max_num_reqs for a stated KV token capacity: the
    estimate ``capacity / context_len * 512`` clamped to [2048, 4096], or the user's
    --max-running-requests per attention-DP rank, never more than capacity // 2."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.runtime_context import get_parallel, get_schedule

    context_len = ModelConfig.from_server_args(sa).context_len
    estimated = max(min(int(token_capacity / context_len * 512), 4096), 2048)
    requested = get_schedule().max_running_requests
    if requested is not None:
        return min(max(1, requested // get_parallel().attn_dp_size), token_capacity // 2)
    return min(estimated, token_capacity // 2)


def jsonable(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        if isinstance(value, dict):
            return {str(k): jsonable(v) for k, v in value.items()}
        if isinstance(value, (list, tuple, set)):
            return [jsonable(v) for v in value]
        return str(value)


def in_child(fn, *args, failed: dict | None = None) -> dict:
    """``fn(*args)`` (a JSON-able dict) evaluated in a forked child, so SGLang's module state in
    this process stays as it was; an exception becomes ``{**failed, "oracle_error": ...}``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            data = json.dumps(fn(*args)).encode()
        except BaseException as e:  # noqa: BLE001 - reported, never raised in the child
            data = json.dumps({**(failed or {}), "oracle_error": f"{type(e).__name__}: {e}"}).encode()
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data) if data else {**(failed or {}), "oracle_error": "child died"}
