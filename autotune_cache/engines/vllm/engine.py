"""vLLM 0.33 as an engine: per-rank files keyed by vLLM's own config hash."""

from __future__ import annotations

from pathlib import Path

from autotune_cache.plan.engine import Engine, ServingCommandReading
from autotune_cache.plan.launcher import split_command
from autotune_cache.engines.vllm.serving_command import (CHOICE_OPTIONS as VLLM_CHOICE_OPTIONS, PROGRAMS,
                                                          check_option_values, command_from_logged_args,
                                                          parse_serving_command)
from autotune_cache.engines.vllm.layout import DIR_LAYOUT, LAYOUT, OVERRIDE_ENV, VllmDirLayout, VllmManagedStore, single_rank
from autotune_cache.engines.vllm.log_lines import DIALECT
from autotune_cache.engines.vllm.planner import FLASHINFER_PINS, VLLM_CHECKED, make_vllm_plan, other_config_refusal
from autotune_cache.engines.vllm.target import VllmTarget, parse_config_hash, printed_levels
from autotune_cache.autotuner.buckets import hybrid_buckets
from autotune_cache.errors import UsageError
from autotune_cache.plan.options import Option
from autotune_cache.plan.request import TuneRequest
from autotune_cache.plan.tuning import TuningPlan


class Vllm(Engine):
    name = "vllm"
    label = "vLLM"
    title = f"vLLM {', '.join(VLLM_CHECKED)}"
    checks = True
    cli_options = (
        Option("vllm_config_hash", "str", metavar="HASH", help="vllm layouts, more than one rank: the 64-hex hash vLLM "
               "names its cache dir by (computed by vLLM after it loads the model); its startup line 'Using FlashInfer "
               "autotune cache file: ...' or that path may be pasted whole. A single-rank vLLM needs none: it reads "
               "FlashInfer's managed store, keyed by the environment.", ours=True),
        Option("max_num_batched_tokens", "positive", help="vllm layouts: the server's --max-num-batched-tokens "
               "[default: vllm serve's for the GPU: 8192 on an H100/H200, 16384 on a B200/B300]."),
    )

    layouts = (LAYOUT, DIR_LAYOUT)
    log_dialect = DIALECT
    programs = PROGRAMS
    flashinfer_pins = FLASHINFER_PINS

    def serving_release(self, engine_option: str | None) -> str | None:
        """The release fi-autotune reproduces (``--engine`` names SGLang releases only)."""
        return VLLM_CHECKED[-1]

    def parse_serving_command(self, tokens: list[str] | tuple[str, ...]) -> ServingCommandReading:
        """As vLLM 0.33's own parser reads it (``serving_command``); a flag or variable that
        changes what vLLM tunes and that fi-autotune does not model is refused."""
        cmd = parse_serving_command(split_command(tokens))
        cmd.check_refused()
        return ServingCommandReading(cmd.serving_kwargs(), tuple(cmd.notes), tuple(cmd.ignored),
                                     tuple(cmd.not_understood), layout=cmd.layout)

    def command_from_logged_args(self, args: dict | None) -> list[str] | None:
        return command_from_logged_args(args)

    def check_option_values(self, values: dict) -> None:
        """The options a vLLM flag sets (``--moe-runner-backend`` is vLLM's ``--moe-backend``) against
        vLLM 0.33's own choices; the rest as the default engine, which spells them, checks them."""
        mapped = {k: v for k, v in values.items() if k in VLLM_CHOICE_OPTIONS}
        super().check_option_values({k: v for k, v in values.items() if k not in VLLM_CHOICE_OPTIONS})
        check_option_values(mapped)

    def target(self, layout: str | None = None, options: dict | None = None) -> VllmTarget:
        """From ``--vllm-config-hash`` (only vLLM can compute it; the planner requires it where
        vLLM reads per-rank files) and ``--max-num-batched-tokens``."""
        layout = self.layout(layout).name
        options = options or {}
        self.refuse_foreign_options(options)
        given = options.get("vllm_config_hash")
        n = options.get("max_num_batched_tokens")
        if given is None:
            return VllmTarget.of("", n, layout)
        levels = printed_levels(given)
        return VllmTarget.of(parse_config_hash(given), n, layout, "/".join(levels) if levels else "")

    def plan_layout(self, request: TuneRequest):
        """A single-rank vLLM reads FlashInfer's managed store at its own root, not its files."""
        f = request.flags
        if single_rank(f.tp, f.pp, f.dp):
            return VllmManagedStore(override_only=request.engine.layout == "vllm-dir")
        if request.engine.layout == "vllm" and VllmDirLayout().configured():
            raise UsageError(f"${OVERRIDE_ENV} is set here: vLLM then reads <that dir>/<config hash>/, not "
                             "$VLLM_CACHE_ROOT/flashinfer_autotune_cache/...: use --layout vllm-dir (or unset it)")
        return super().plan_layout(request)

    def target_from_dict(self, d: dict) -> VllmTarget:
        return VllmTarget.from_dict(d)

    def plan(self, request: TuneRequest, cache_root: Path) -> TuningPlan:
        return make_vllm_plan(request, cache_root)

    def tuning_buckets(self, plan: TuningPlan) -> tuple[int, ...]:
        """``get_hybrid_num_tokens_buckets(max_num_batched_tokens)``: one dummy run at that many tokens."""
        return tuple(hybrid_buckets(plan.resolution.chunked_prefill_size))

    def existing_entry_refusal(self, manifest, plan: TuningPlan) -> str | None:
        """The hash is given, not derived from the flags: one copied from another server names
        another configuration's entry."""
        return other_config_refusal(manifest, plan)

    def describe(self, plan: TuningPlan) -> list[tuple[str, str]]:
        n = plan.resolution.chunked_prefill_size
        tuning = f"autotune(tuning_buckets=get_hybrid_num_tokens_buckets({n}), round_up=True)"
        layout = self.plan_layout(plan.request) if plan.request is not None else LAYOUT
        return layout.tuning_pass(plan, tuning)  # the ranks' files, or a single rank's managed store


ENGINE = Vllm()
