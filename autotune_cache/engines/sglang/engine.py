"""SGLang 0.5.23 as an engine: its tree, its key, its startup autotune pass."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from autotune_cache.plan.engine import Engine, ServingCommandReading
from autotune_cache.engines.sglang.layout import LAYOUT
from autotune_cache.engines.sglang.log_lines import DIALECT
from autotune_cache.engines.sglang.planner import make_plan
from autotune_cache.engines.sglang.serving_command import (PROGRAMS, check_option_values, command_from_logged_args,
                                                           flag_table, parse_serving_command)
from autotune_cache.engines.sglang.key_schemas import FLASHINFER_PINS, SCHEMAS, pick_schema, serving_release
from autotune_cache.plan.entry_key import get_schema
from autotune_cache.plan.request import TuneRequest
from autotune_cache.plan.tuning import TuningPlan


class SGLang(Engine):
    name = "sglang"
    label = "SGLang"
    title = "SGLang 0.5.23"
    checks = True
    programs = PROGRAMS

    layouts = (LAYOUT,)
    log_dialect = DIALECT
    key_schemas = SCHEMAS
    flashinfer_pins = FLASHINFER_PINS

    def pick_schema(self, schema: str | None, release: str | None) -> tuple[str, str]:
        return pick_schema(schema, release)

    def serving_release(self, engine_option: str | None) -> str | None:
        return serving_release(engine_option)

    def workers(self, request: TuneRequest) -> list[TuneRequest]:
        """The target, and with speculative decoding the draft worker, which SGLang tunes into an
        entry of its own (key ``...|draft_quant=<quant>``)."""
        if not request.flags.speculative_algorithm:
            return [request]
        return [replace(request, worker="target"), replace(request, worker="draft")]

    def plan(self, request: TuneRequest, cache_root: Path) -> TuningPlan:
        return make_plan(
            request.model, request.flags, request.arch, config=request.config, revision=request.revision,
            schema=request.schema, flashinfer_version=request.flashinfer_version, cache_root=cache_root,
            max_tokens=request.max_tokens, model_path=request.model_path, request=request, worker=request.worker,
        )

    def parse_serving_command(self, tokens: list[str] | tuple[str, ...]) -> ServingCommandReading:
        """As SGLang 0.5.23's argument parser reads it (``serving_command``); a flag that changes
        what SGLang tunes and that fi-autotune does not model is refused."""
        cmd = parse_serving_command(tokens)
        cmd.check_refused()
        return ServingCommandReading(cmd.serving_kwargs(), tuple(cmd.notes), tuple(cmd.ignored),
                                     tuple(cmd.not_understood))

    def command_from_logged_args(self, args: dict | None) -> list[str] | None:
        return command_from_logged_args(args)

    def check_option_values(self, values: dict) -> None:
        """Against the choices of SGLang 0.5.23's own parser."""
        check_option_values(values)

    def dp_meaning(self, topology) -> str | None:
        """fi-autotune's ``--dp N`` is DP attention (SGLang ``--dp-size N --enable-dp-attention``:
        ``attn_dp_size`` N in the key); SGLang's ``--dp-size N`` alone is N replicas (``attn_dp_size``
        1, each replica its own rank files): two different keys."""
        tp, dp = topology.tp, topology.dp
        if dp == 1:
            return None
        if topology.dp_attention:
            return (f"dp {dp} = DP attention (SGLang --tp-size {tp} --dp-size {dp} --enable-dp-attention): "
                    f"attn_dp_size {dp} in the key; SGLang's --dp-size {dp} alone means {dp} replicas, a different "
                    "key (--no-dp-attention here)")
        return (f"dp {dp} = {dp} replicas (SGLang --tp-size {tp} --dp-size {dp} without --enable-dp-attention): "
                f"attn_dp_size 1 in the key; with --enable-dp-attention it is DP attention, a different key "
                "(drop --no-dp-attention here)")

    def alternatives(self, plan: TuningPlan) -> list[dict]:
        """A MoE model left on ``--moe-runner-backend auto`` that SGLang would not autotune: each
        FlashInfer MoE runner SGLang 0.5.23 takes (its own choices, from the flag table)."""
        if plan.resolution.autotunes or not plan.spec.moe or plan.request is None \
                or plan.request.flags.moe_runner_backend not in (None, "auto"):
            return []
        flag = flag_table().get("--moe-runner-backend")
        quant = plan.spec.quant.method if plan.spec.quant else None
        # flashinfer_mxfp4 dispatches on MXFP4 weights only (flashinfer_cutlass.py raises
        # "Unexpected quant_info type" for others): never offered for another checkpoint.
        return [{"moe_runner_backend": c} for c in (flag.choices or ()) if c.startswith("flashinfer")
                and (c != "flashinfer_mxfp4" or quant == "mxfp4")] if flag else []

    def describe(self, plan: TuningPlan) -> list[tuple[str, str]]:
        """SGLang's startup passes, attention, speculative workers, serving sizes and key."""
        r = plan.resolution
        rows = []
        dp = self.dp_meaning(r.topology)
        if dp:
            rows.append(("DP", dp))
        for p in r.passes:
            batch = (f"{p.batch[0]}" if p.batch[0] == p.batch[1]
                     else f"{p.batch[0]}-{p.batch[1]} (the request pool SGLang sizes from KV memory)")
            gather = f", x{r.attn_dp_size} at each MoE layer (dp gather)" if plan.spec.moe and r.gather > 1 else ""
            rows.append(("Dummy pass", f"{p.phase} ({p.runner}): batch {batch} x {p.tokens_per_req} token(s) per "
                                       f"request{gather}"))
        if not r.passes:
            rows.append(("Dummy pass", "none"))
        a = r.attention
        if a is not None and plan.spec.mla is not None:
            dsa = f" (DSA decode {a.dsa_decode_backend})" if a.dsa_decode_backend else ""
            rows.append(("Attention", f"decode {a.decode_backend}{dsa}, KV {a.kv_cache_dtype}, page {a.page_size}, "
                                      f"context {a.context_length}"))
        if r.speculative is not None:
            s = r.speculative
            rows.append(("Speculative", f"{s.algorithm} steps={s.num_steps} topk={s.eagle_topk} draft_tokens="
                                        f"{s.num_draft_tokens}, draft {s.draft_model_path}"
                         + (" (the checkpoint's MTP layer)" if s.self_draft else "")
                         + (" - this plan: the DRAFT worker" if r.is_draft else " - this plan: the target worker")))
        graphs = f"decode CUDA graphs up to {r.decode_batch}" if r.decode_cuda_graph else "decode CUDA graphs off"
        rows.append(("Serving", f"chunked prefill {r.chunked_prefill_size} tokens per DP rank, {graphs}"))
        source = f", from {plan.request.schema_source}" if plan.request is not None and plan.request.schema_source else ""
        rows.append(("Key", f"{plan.key}  (schema {plan.schema}: {get_schema(plan.schema).description}{source})"))
        rows.append(("Key string", plan.key_string))
        return rows


ENGINE = SGLang()
