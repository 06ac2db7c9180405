"""Speculative decoding in SGLang 0.5.23: what the target and the draft worker tune, and when.

With ``--speculative-algorithm EAGLE`` (``NEXTN`` is its alias) on a DeepSeek-family model the
draft is the checkpoint's own MTP layer (``num_nextn_predict_layers``); EAGLE3 drafts with a
separate model (``--speculative-draft-model-path``). Either way SGLang tunes twice, into two
entries (runner/flashinfer_autotune.py):

- the target worker, in its EagerRunner warmup, in TARGET_VERIFY shape: each request carries
  ``speculative_num_draft_tokens`` tokens (``resolve_num_tokens_per_req("target_verify")``);
- the draft worker, once per draft CUDA-graph phase at the largest captured batch
  (``maybe_flashinfer_autotune_speculative_draft``): draft decode with ``speculative_eagle_topk``
  tokens per request and draft extend with ``speculative_num_draft_tokens``; under its own key
  (``...|draft_quant=<the draft's quantization>``), its MoE backend from
  ``--speculative-moe-runner-backend`` (default: the target's).

The defaults mirror arg_groups/speculative_hook.py: ``_handle_eagle_family`` (48 running
requests unless given; the draft path defaults to the model for MTP architectures; steps, top-k
and draft tokens from ``_auto_choose_speculative_params`` when no step count is given; top-k 1
forces draft tokens = steps + 1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from autotune_cache.errors import UsageError

#: --speculative-algorithm values fi-autotune models, after SGLang's alias (NEXTN -> EAGLE).
MODELLED = ("EAGLE", "EAGLE3")
ALIASES = {"NEXTN": "EAGLE"}
#: speculative_hook.py _handle_eagle_family: architectures whose draft is their own MTP layer.
MTP_ARCHS = ("DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "GlmMoeDsaForCausalLM")
#: _auto_choose_speculative_params: (steps, topk, draft tokens) by target architecture.
AUTO_PARAMS = {"LlamaForCausalLM": (5, 4, 8)}
AUTO_DEFAULT = (3, 1, 4)
#: _handle_eagle_family: max running requests without --max-running-requests.
DEFAULT_MAX_RUNNING = 48


@dataclass(frozen=True)
class Speculative:
    algorithm: str
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    draft_model_path: str
    draft_moe_runner_backend: str  # resolved later by the draft's own resolution; "" = the target's
    self_draft: bool  # the draft is the target checkpoint's MTP layer

    def to_dict(self) -> dict:
        return asdict(self)


#: speculative/spec_info.py SpeculativeAlgorithm (NEXTN is an alias of EAGLE).
BUILTIN = frozenset({"EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO", "FROZEN_KV_MTP"})


def resolve_speculative(architecture: str, model_path: str, *, algorithm: str | None, num_steps: int | None,
                        eagle_topk: int | None, num_draft_tokens: int | None, draft_model_path: str | None,
                        draft_moe_runner_backend: str | None) -> Speculative | None:
    if algorithm is None:
        # SGLang 0.5.23 reads none of the --speculative-* values without an algorithm (the flag
        # probes: same resolution with or without them); so does fi-autotune.
        return None
    algo = ALIASES.get(algorithm.upper(), algorithm.upper())
    if algo not in BUILTIN:
        raise UsageError(f"--speculative-algorithm {algorithm}: not one of SGLang 0.5.23's algorithms "
                         f"({', '.join(sorted(BUILTIN))}; a plugin-registered one is not modelled)")
    if algo not in MODELLED:
        raise UsageError(f"--speculative-algorithm {algorithm}: fi-autotune models EAGLE (NEXTN, the MTP draft) "
                         f"and EAGLE3; SGLang 0.5.23 tunes {algorithm} differently and it is not modelled")
    self_draft = architecture in MTP_ARCHS and algo == "EAGLE" and draft_model_path in (None, model_path)
    if draft_model_path is None:
        if architecture not in MTP_ARCHS:
            raise UsageError(f"--speculative-algorithm {algorithm} on {architecture} without "
                             "--speculative-draft-model-path: not modelled (SGLang 0.5.23 would load the target "
                             "checkpoint itself as the draft; an EAGLE draft is a separate model)")
        draft_model_path = model_path
    if num_steps is None:
        if eagle_topk is not None or num_draft_tokens is not None:
            # SGLang asserts this combination (_handle_eagle_family).
            raise UsageError("--speculative-eagle-topk / --speculative-num-draft-tokens need "
                             "--speculative-num-steps as well (SGLang 0.5.23 rejects them alone)")
        num_steps, eagle_topk, num_draft_tokens = AUTO_PARAMS.get(architecture, AUTO_DEFAULT)
    if eagle_topk is None:
        eagle_topk = 1
    for name, value in (("--speculative-num-steps", num_steps), ("--speculative-eagle-topk", eagle_topk)):
        if value < 1:
            raise UsageError(f"{name} must be >= 1, got {value}")
    if eagle_topk == 1:
        num_draft_tokens = num_steps + 1  # "adjusted to speculative_num_steps + 1 when topk == 1"
    elif num_draft_tokens is None:
        raise UsageError("--speculative-eagle-topk > 1 needs --speculative-num-draft-tokens")
    return Speculative(algo, num_steps, eagle_topk, num_draft_tokens, draft_model_path,
                       draft_moe_runner_backend or "", self_draft)
