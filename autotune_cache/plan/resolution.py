"""What an engine decides at startup for a model, an arch and the serving flags: the part of it
that shapes the cache key, whether autotune runs, and the shapes and token counts of the tuned
calls. Engines compute it (``engines/sglang/resolve.py``); the plan and the tuner only read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from autotune_cache.plan.flags import ServerFlags
from autotune_cache.plan.entry_key import KeyFields
from autotune_cache.plan.topology import Topology


def arch_major(arch: str) -> int:
    digits = arch[2:].rstrip("abcdefghijklmnopqrstuvwxyz")
    return int(digits[:-1])


@dataclass(frozen=True)
class DummyPass:
    """One autotune forward SGLang runs at startup: ``batch`` requests (a range where SGLang sizes
    the request pool from the KV-cache memory it profiles) of ``tokens_per_req`` tokens each."""

    phase: str  # decode | target_verify | draft_decode | draft_extend | extend
    runner: str
    batch: tuple[int, int]  # (smallest, largest) possible batch per DP rank
    tokens_per_req: int

    def tokens(self, gather: int = 1) -> tuple[int, int]:
        return self.batch[0] * self.tokens_per_req * gather, self.batch[1] * self.tokens_per_req * gather

    def to_dict(self) -> dict:
        return {"phase": self.phase, "runner": self.runner, "batch": list(self.batch),
                "tokens_per_req": self.tokens_per_req}


@dataclass(frozen=True)
class Resolution:
    arch: str
    flags: ServerFlags
    topology: Topology
    key_fields: KeyFields
    dtype: str  # torch name, e.g. bfloat16
    quantization: str | None  # server-side value that goes into the key
    model_quantization: str | None  # ModelConfig.quantization: what the layers run
    moe_runner_backend: str
    attn_dp_size: int
    attn_tp_size: int
    moe_tp_size: int
    moe_ep_size: int
    experts_per_rank: int | None
    moe_intermediate_per_partition: int | None
    autotunes: bool
    reasons: tuple[str, ...]
    decode_batch: int  # per-rank decode CUDA-graph max batch (serving; careful mode's graph sizes)
    chunked_prefill_size: int  # per attention-DP rank (SGLang divides it by attn_dp_size)
    notes: tuple[str, ...] = field(default=())
    #: The engine's attention decisions (SGLang: ``engines.sglang.attention.Attention``), or None.
    attention: Any = None
    #: Its speculative workers (SGLang: ``engines.sglang.speculative.Speculative``), or None.
    speculative: Any = None
    #: "target", or "draft": the speculative draft worker, tuned into its own entry.
    worker: str = "target"
    #: Requests per DP rank the pool holds: SGLang sizes it from the KV-cache memory it profiles
    #: (kv_cache_configurator.py resolve_max_num_reqs: 2048..4096), unless --max-running-requests.
    request_pool: tuple[int, int] = (2048, 4096)
    passes: tuple[DummyPass, ...] = ()
    #: The FlashInfer backend of the NVFP4 linear layers' mm_fp4 (fp4_utils.py), or None.
    fp4_gemm_backend: str | None = None
    #: The MoE input is all-gathered over the attention-DP ranks (utils.require_mlp_tp_gather).
    mlp_gather: bool = False
    #: Decode runs in CUDA graphs (not with --disable-cuda-graph, nor on the torch-native / Flex
    #: attention backends, which turn them off).
    decode_cuda_graph: bool = True
    #: Shared experts SGLang fuses into the routed-expert kernel (extra experts and top-k slots).
    fused_shared_experts: int = 0
    #: The quant method and MoE runner SGLang's own dispatch gives the experts (SGLang:
    #: ``engines.sglang.dispatch.Dispatch``), where a recorded probe covers them; else None.
    moe_dispatch: Any = None

    @property
    def moe_tokens(self) -> int:
        """Tokens a MoE layer sees in the largest dummy pass (gathered over attention-DP ranks)."""
        return max((p.tokens(self.gather)[1] for p in self.passes), default=0)

    @property
    def gather(self) -> int:
        return self.attn_dp_size if self.mlp_gather else 1

    @property
    def is_draft(self) -> bool:
        return self.worker == "draft"

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items()
             if k not in ("flags", "topology", "key_fields", "attention", "speculative", "passes")}
        d["flags"] = self.flags.to_dict()
        d["topology"] = self.topology.to_dict()
        d["key_fields"] = self.key_fields.to_dict()
        d["moe_tokens"] = self.moe_tokens
        d["attention"] = self.attention.to_dict() if self.attention else None
        d["speculative"] = self.speculative.to_dict() if self.speculative else None
        d["passes"] = [p.to_dict() for p in self.passes]
        d["request_pool"] = list(self.request_pool)
        return d
