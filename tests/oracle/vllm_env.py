"""vLLM 0.33 set up on a fake GPU, for the vLLM oracle scripts in this folder.

Run only in an interpreter that has vllm==0.33.0 (see README.md here, "A vLLM interpreter").
``boot`` must come before any vllm import: vLLM picks its platform (CUDA), its defaults (token
budget, CUDA-graph sizes, compilation passes) and its kernels' availability from the GPU it sees.
``resolve`` runs vLLM's own ``vllm serve`` parser and ``create_engine_config`` on a serving
command; ``build_model`` then builds the model as a worker's loader does (``initialize_model``,
on the meta device: no weights), which is where vLLM picks each MoE layer's quant method and
experts kernel and appends the layer's name to the config it later hashes.

What is not vLLM's own code here, and why (each is the least that lets vLLM's Python run):

- the GPU: ``fakegpu.install`` (torch.cuda) plus an NVML stand-in answering as the same GPU
  (vLLM's ``NvmlCudaPlatform`` reads capability, name and memory through NVML);
- vLLM's compiled extensions (``vllm._C`` and friends, built for CUDA against another torch):
  importable stand-ins whose kernels raise when called (``cudastubs``), and ``torch.ops._C``
  answering the three capability queries vLLM asks at import time as the CUDA 13 build answers
  them (csrc/quantization/w8a8/cutlass/scaled_mm_entry.cu: FP8 from sm89, block FP8 from sm90,
  FP4 from sm100); ``register_fake`` for those missing operators is skipped;
- process groups: one stand-in per group (``_TP``, ``_DP``, ``_EP``, ...) with the configured
  width, rank 0, and no communication (nothing here communicates);
- model weights: none are read; ``--model org/name`` is served from a relative directory holding
  the config fi-autotune ships (as the SGLang oracle does, ``sglang_env.materialize_models``).
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import sys
import tempfile
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cudastubs  # noqa: E402
import fakegpu  # noqa: E402

#: vLLM's compiled extension modules (CUDA builds): stood in for, never loaded.
EXTENSIONS = ("vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C", "vllm._qutlass_C", "vllm.cumem_allocator",
              "vllm._flashmla_C", "vllm._flashmla_extension_C", "vllm._rocm_C", "vllm._custom_ops_rocm",
              "vllm.vllm_flash_attn._vllm_fa2_C", "vllm.vllm_flash_attn._vllm_fa3_C")
#: torch.ops namespaces those extensions register: fake-tensor registrations for them are skipped.
OP_NAMESPACES = ("_C", "_moe_C", "_C_cache_ops", "_C_custom_ar", "_rocm_C", "_qutlass_C", "_flashmla_C",
                 "_flashmla_extension_C", "_vllm_fa2_C", "_vllm_fa3_C", "_C_stable_libtorch")
#: (capability major*10+minor) -> what the CUDA 13 build's capability queries answer
#: (csrc/quantization/w8a8/cutlass/scaled_mm_entry.cu: FP8 from sm89 with CUDA 12.4, block FP8 and
#: grouped FP8 GEMM from sm90 with CUDA 12.0 / 12.3, sm100 with 12.8; FP4 from sm100 with 12.8).
CAPABILITY_QUERIES = {
    "cutlass_scaled_mm_supports_fp8": lambda cap: cap >= 89,
    "cutlass_scaled_mm_supports_block_fp8": lambda cap: cap >= 90,
    "cutlass_group_gemm_supported": lambda cap: cap >= 90,
    "cutlass_scaled_mm_supports_fp4": lambda cap: cap >= 100,
}
FACTS: dict = {}


class _Extensions(cudastubs._Finder):
    def find_spec(self, name, path, target=None):
        if any(name == e or name.startswith(e + ".") for e in EXTENSIONS):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None


class _OpsC:
    """``torch.ops._C`` of a CUDA build: the capability queries answered, every kernel a stub."""

    def __getattr__(self, name: str):
        if name in CAPABILITY_QUERIES:
            return CAPABILITY_QUERIES[name]
        return cudastubs._Kernel(f"torch.ops._C.{name}")


def _nvml(kind: str, count: int) -> types.ModuleType:
    """NVML answering as ``count`` GPUs of ``kind`` (fakegpu.GPUS)."""
    import pynvml as real  # nvidia-ml-py: its constants and error class

    name, cap, mib, _sms = fakegpu.GPUS[kind]
    fake = types.ModuleType("pynvml")
    for attr in dir(real):
        if attr.startswith(("NVML", "nvmlMemory")) or attr[:1].isupper():
            setattr(fake, attr, getattr(real, attr))

    class Handle:
        def __init__(self, i: int):
            self.i = i

    def handle_by_uuid(uuid: str) -> Handle:
        return Handle(int(uuid.rsplit("-", 1)[-1]))

    fake.nvmlInit = fake.nvmlShutdown = lambda *a, **k: None
    fake.nvmlDeviceGetCount = lambda: count
    fake.nvmlDeviceGetHandleByIndex = Handle
    fake.nvmlDeviceGetHandleByUUID = handle_by_uuid
    fake.nvmlDeviceGetIndex = lambda h: h.i
    fake.nvmlDeviceGetCudaComputeCapability = lambda h: cap
    fake.nvmlDeviceGetName = lambda h: name
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=mib << 20, free=(mib - 1024) << 20,
                                                                   used=1024 << 20)
    fake.nvmlDeviceGetUUID = lambda h: f"GPU-00000000-0000-0000-0000-{h.i:012d}"
    fake.nvmlDeviceGetP2PStatus = lambda a, b, c: real.NVML_P2P_STATUS_OK
    fake.nvmlDeviceGetNumaNodeId = lambda h: 0
    fake.nvmlSystemGetCudaDriverVersion = lambda: 13000
    fake.nvmlSystemGetDriverVersion = lambda: "580.65.06"
    return fake


def claim_stdout():
    """The process's stdout for the result alone: vLLM logs to stdout, so from here on fd 1 is
    stderr and the returned file is the real stdout."""
    real = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return real


def boot(arch: str, gpus: int = 8, workdir: str | None = None) -> Path:
    """Fake GPU, NVML and extensions; a private working directory with vLLM's caches inside it."""
    import torch
    import torch.library

    cudastubs.install()
    sys.meta_path.insert(0, _Extensions())
    FACTS.update(fakegpu.install(arch, gpus), arch=arch)
    torch.ops._C = _OpsC()
    real_register_fake = torch.library.register_fake

    def register_fake(op, fn=None, **kw):
        name = op if isinstance(op, str) else ""
        if name.split("::")[0] in OP_NAMESPACES:
            return (lambda f: f) if fn is None else fn
        return real_register_fake(op, fn, **kw)

    torch.library.register_fake = register_fake
    nvml = _nvml(arch, gpus)
    sys.modules["pynvml"] = nvml
    import vllm.utils.import_utils as iu

    iu.import_pynvml = lambda: nvml
    import vllm.platforms.cuda as cuda_platform  # NvmlCudaPlatform, with NVML as above

    # torch counts devices through its own CUDA build (a CPU build counts none): the same count
    cuda_platform._cuda_device_count_stateless = lambda *_: gpus
    work = Path(workdir or tempfile.mkdtemp(prefix="vllm-oracle-"))
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)
    os.environ["VLLM_CACHE_ROOT"] = str(work / "cache")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    return work


def materialize_models(models: dict[str, dict]) -> None:
    """As the SGLang oracle serves them: ./org/name/config.json (+ ModelOpt sidecar)."""
    import sglang_env  # imports no SGLang: only the model-directory helpers are used

    sglang_env.materialize_models(models)


#: The launchers fi-autotune reads, as vLLM's own entry points build their parsers.
LAUNCHERS = ("vllm serve", "python -m vllm.entrypoints.openai.api_server")


def serve_parser(launcher: str = "vllm serve"):
    """The parser ``launcher`` parses with: ``vllm serve`` is the ``serve`` subcommand of vLLM's
    CLI (``entrypoints/cli/main.py``: a top-level ``FlexibleArgumentParser`` whose ``serve``
    subparser ``ServeSubcommand.subparser_init`` makes); the deprecated api_server module parses
    with ``make_arg_parser`` over a plain ``FlexibleArgumentParser`` (``launchers/api_server/entry.py``)."""
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if launcher == "vllm serve":
        from vllm.entrypoints.cli.serve import ServeSubcommand

        top = FlexibleArgumentParser(description="vLLM CLI")
        subparsers = top.add_subparsers(required=False, dest="subparser")
        ServeSubcommand().subparser_init(subparsers)
        return top
    return make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))


def parse(argv: list[str], launcher: str = "vllm serve"):
    """The namespace ``launcher ARGV`` ends with before the engine config is made: ``vllm serve``
    moves ``--model`` to the positional (``FlexibleArgumentParser.parse_args``) and the positional
    wins (``ServeSubcommand.cmd``); the api_server module reads ``--model`` only."""
    from vllm.entrypoints.common.cli_args import validate_parsed_serve_args

    if launcher == "vllm serve":
        args = serve_parser(launcher).parse_args(["serve", *argv])
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
    else:
        args = serve_parser(launcher).parse_args(list(argv))
    validate_parsed_serve_args(args)
    return args


def resolve(argv: list[str], env: dict | None = None, launcher: str = "vllm serve"):
    """The ``VllmConfig`` vLLM's API server builds for ``LAUNCHER ARGV`` (its own parser, its
    own ``create_engine_config`` with the OpenAI server's usage context)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    os.environ.update(env or {})
    args = parse(argv, launcher)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    return engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)


class _Group:
    """A process group of ``n`` ranks seen from rank 0: widths only, no communication."""

    def __init__(self, n: int, name: str):
        self.n = n
        self.unique_name = name

    def size(self) -> int:
        return self.n

    def rank(self) -> int:
        return 0


class _Coordinator:
    def __init__(self, n: int, name: str):
        self.world_size, self.rank_in_group, self.rank, self.local_rank = n, 0, 0, 0
        self.ranks = list(range(n))
        self.unique_name = name
        self.device_group = self.cpu_group = _Group(n, name)
        self.device_communicator = None
        self.use_device_communicator = False
        self.is_first_rank, self.is_last_rank = True, n == 1

    def __getattr__(self, item: str):
        raise AttributeError(f"the oracle's {self.unique_name} group stand-in has no {item}")


def install_groups(cfg) -> None:
    """Rank 0 of every group vLLM's ``initialize_model_parallel`` would make for ``cfg``."""
    import vllm.distributed.parallel_state as ps

    pc = cfg.parallel_config
    tp, pp, dp = pc.tensor_parallel_size, pc.pipeline_parallel_size, pc.data_parallel_size
    pcp, dcp = getattr(pc, "prefill_context_parallel_size", 1), getattr(pc, "decode_context_parallel_size", 1)
    # init_distributed_environment: with data parallelism the world spans every DP rank
    ps._WORLD = _Coordinator(tp * pp * pcp * dp, "world")
    ps._TP, ps._PP, ps._DP = _Coordinator(tp, "tp"), _Coordinator(pp, "pp"), _Coordinator(dp, "dp")
    ps._EP = _Coordinator(tp * dp * pcp if pc.enable_expert_parallel else 1, "ep")
    ps._PCP, ps._DCP = _Coordinator(pcp, "pcp"), _Coordinator(dcp, "dcp")
    ps._EPLB, ps._ETP = _Coordinator(1, "eplb"), _Coordinator(1, "etp")
    ps._NODE_COUNT = 1


def build_model(cfg):
    """The model as the worker's loader builds it (``initialize_model``), on the meta device."""
    import torch
    from vllm.model_executor.model_loader.utils import initialize_model

    install_groups(cfg)
    with torch.device("meta"):
        return initialize_model(cfg)


def moe_layers(cfg) -> list:
    ctx = cfg.compilation_config
    return [ctx.static_forward_context[name] for name in ctx.static_all_moe_layers]


def in_child(fn, *args, failed: dict | None = None) -> dict:
    """``fn(*args)`` in a forked child (vLLM's module state here stays as it was)."""
    import sglang_env

    return sglang_env.in_child(fn, *args, failed=failed)


def dump(obj) -> str:
    return json.dumps(obj, sort_keys=True, default=str)
