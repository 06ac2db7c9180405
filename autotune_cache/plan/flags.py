"""The serving flags a request carries: what the user's serving command sets that fi-autotune models.

One typed record for every engine (vLLM reads the topology and backend fields of it too); each
engine's resolution (``engines/<engine>/resolve``) turns it into a ``plan.resolution.Resolution``.
Recorded in each manifest's request, so ``from_dict`` refuses what it cannot read exactly.

Filled from the serving options (``plan.options.SERVING_OPTIONS``: each row's ``records`` names
the field it fills, ``RECORDED_AS`` how, where it is not as given). Its fields are written out
here rather than generated from that table: they are the manifest's keys, in the order entries on
disk hold them, and a new one is a deliberate change of that record (tests/plan/test_options.py
fails when this class and the table disagree).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ServerFlags:
    """The sglang server flags that matter here; None means "left to SGLang's default"."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    dp_attention: bool = True
    ep: int = 1
    dtype: str = "auto"
    quantization: str | None = None
    moe_runner_backend: str = "auto"
    moe_a2a_backend: str = "none"
    skip_ops: tuple[str, ...] = ()
    max_running_requests: int | None = None
    cuda_graph_max_bs: int | None = None
    chunked_prefill_size: int | None = None
    autotune_extend: bool = False  # SGLANG_FLASHINFER_AUTOTUNE_EXTEND=1
    trust_remote_code: bool = False
    kv_cache_dtype: str = "auto"
    page_size: int | None = None
    context_length: int | None = None
    attention_backend: str | None = None
    decode_attention_backend: str | None = None
    prefill_attention_backend: str | None = None
    dsa_decode_backend: str | None = None
    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_moe_runner_backend: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_attention_mode: str | None = None
    fp4_gemm_backend: str = "auto"
    disaggregation_mode: str = "null"
    decode_cuda_graph: bool = True  # False: --disable-cuda-graph / --cuda-graph-backend-decode disabled
    moe_fused_finalize: bool = False  # SGLANG_FLASHINFER_MOE_FUSED_FINALIZE=1 (cutlass MoE's key has it)
    #: Why the server will not autotune at all (--disable-flashinfer-autotune, ...), or None.
    autotune_disabled_by: str | None = None
    #: The GPUs the tp ranks run on, in tp-rank order: flashinfer_megamoe (0.5.22+) names each
    #: rank file after its GPU's UUID.
    gpu_uuids: tuple[str, ...] = ()
    #: The JSON object the server applies to the model's config (SGLang --json-model-override-args,
    #: vLLM --hf-overrides), canonical (sorted keys); None: none.
    config_overrides: str | None = None

    @property
    def overrides(self) -> dict | None:
        import json

        return json.loads(self.config_overrides) if self.config_overrides else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["skip_ops"] = list(self.skip_ops)
        d["gpu_uuids"] = list(self.gpu_uuids)
        return d

    @classmethod
    def from_dict(cls, d: object) -> "ServerFlags":
        """From a manifest's request; unknown names (a newer fi-autotune's) are a ValueError,
        so a renamed flag can never be silently dropped."""
        if not isinstance(d, dict):
            raise ValueError("flags is not an object")
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown server flags {sorted(unknown)}")
        values = dict(d)
        for name in ("skip_ops", "gpu_uuids"):
            if name in values:
                if not isinstance(values[name], (list, tuple)) or not all(isinstance(s, str) for s in values[name]):
                    raise ValueError(f"{name} is not a list of strings")
                values[name] = tuple(values[name])
        for name, f in cls.__dataclass_fields__.items():
            if name not in values or name in ("skip_ops", "gpu_uuids"):
                continue
            v = values[name]
            kind = {"int": int, "int | None": (int, type(None)), "bool": bool, "str": str,
                    "str | None": (str, type(None))}.get(str(f.type))
            if kind is not None and (not isinstance(v, kind) or (kind is int and isinstance(v, bool))):
                raise ValueError(f"flag {name} has the wrong type")
        return cls(**values)
