"""``check``: will the engine launched with these flags find and use its cache? (no GPU)"""

from __future__ import annotations

import click

from autotune_cache import registry
from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.check import run_check
from autotune_cache.tree.layout import DEFAULT_LAYOUT_NAME
from autotune_cache.errors import ExitCode

from .output import Output
from .params import LayoutName, env_from_option, json_option, targets_option, timeout_option
from .serving import (build_plan, engine_options, fold_serving_command, request_from, serving_command_argument,
                      serving_options)
from .targetscmd import check_targets


def _readers() -> list[str]:
    return [layout.name for engine in registry.engines() if engine.checks for layout in engine.layouts]


@click.command("check")
@serving_options
@click.option("--store", "store_url", default=None, help="Check a store (s3://, gs://, file://, https://) instead of a tree.")
@click.option("--layout", "layout_name", type=LayoutName(_readers), default=DEFAULT_LAYOUT_NAME, show_default=True,
              help="The reader to check for: SGLang's rank files, FlashInfer's managed store (needs --env-from: "
                   "its directory is named by the serving environment), or vLLM's files (vllm, vllm-dir; a "
                   "single-rank vLLM: its managed store, with --env-from).")
@engine_options
@env_from_option
@click.option("--strict", is_flag=True, help="Exit 1 on any miss (fail the build before a slow boot does).")
@targets_option
@timeout_option
@json_option
@serving_command_argument
@click.pass_context
def check_cmd(ctx, store_url, layout_name, env_from, strict, targets_file, as_json, **kw):
    """Check, without a GPU, that the engine will find and use its cache.

    For the serving flags (or the serving command after `--`): is an entry at the path the
    engine computes, complete and identical across each TP group, holding every FlashInfer key
    the startup pass looks up, tuned in an environment matching the serving image
    (`--env-from`, from `fi-autotune env --json` run there)? Each miss is one line saying why.
    Exit 0 unless `--strict` and something would miss. With --targets, every target of a
    targets file (the gate an image build runs).
    """
    out = Output(as_json)
    reader = registry.get_layout(layout_name)
    fingerprint = Fingerprint.load(env_from) if env_from else None
    if targets_file:
        check_targets(ctx, out, targets_file, kw, store_url, layout_name, fingerprint, strict)
        return
    kw = fold_serving_command(ctx, kw, out)
    # A planning engine's layout names the engine whose calls are checked; a store's (FlashInfer's
    # managed store) is read with the default engine's.
    engine_layout = layout_name if registry.engine_of_layout(layout_name).plans else None
    request = request_from(kw, engine_layout).for_target(fingerprint)
    checks = []
    for r in request.workers():
        plan = build_plan(r, kw["cache_dir"])
        report = run_check(plan, reader, store_url, fingerprint, kw["cache_dir"])
        # A flag whose effect on the autotune path is not known: the verdict cannot be trusted.
        unknown = [f"the serving command's {flag} is not understood: fi-autotune cannot tell what it changes"
                   for flag in kw.get("not_understood") or ()]
        (report.misses if strict else report.warnings).extend(unknown)
        checks.append((r.worker, plan, report, len(unknown) if strict else 0))

    def human() -> None:
        for worker, plan, report, n_unknown in checks:
            who = "" if len(checks) == 1 else f"{worker} worker: "
            for w in report.warnings:
                if "is not understood: fi-autotune cannot tell" not in w:  # printed once, by the command parser
                    out.note(f"warning: {who}{w}")
            for m in report.misses:
                out.line(f"MISS: {who}{m}")
            if report.ok and not report.autotunes:
                out.line(f"OK: {who}{'; '.join(plan.reasons)}")
            elif report.ok:
                files = f"{report.rank_files} rank files, " if plan.layout_obj.holds_rank_files else ""
                out.line(f"OK: {who}{report.where}: {files}{report.keys_checked} startup lookups, all present")
            elif len(report.misses) > n_unknown:
                out.line(f"{len(report.misses)} miss(es): {who}the engine would tune at startup")
            else:
                out.line(f"{len(report.misses)} miss(es): {who}not confirmed: the command has flags fi-autotune "
                         "does not understand")

    def data() -> dict:
        if len(checks) == 1:
            return checks[0][2].to_dict()
        return {"ok": all(c[2].ok for c in checks), **{c[0]: c[2].to_dict() for c in checks}}

    out.emit(human=human, data=data)
    if strict and not all(c[2].ok for c in checks):
        raise click.exceptions.Exit(int(ExitCode.FAILURE))
