"""``check``: will the engine launched with these flags find and use its cache? (no GPU)"""

from __future__ import annotations

import click

from autotune_cache.check import Candidate, CheckReport, check_files, files_of_bundle, nearest_difference
from autotune_cache.errors import ExitCode, UsageError
from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.registry import default_layout
from autotune_cache.autotuner.rankfile import read_regular_file

from .output import Output
from .params import env_from_option, json_option, resolve_root, targets_option
from .plancmd import apply_serving_command, build_plan, request_from, serving_command_argument, serving_options


@click.command("check")
@serving_options
@click.option("--store", "store_url", default=None, help="Check a store (s3://, gs://, file://, https://) instead of a tree.")
@click.option("--layout", "layout_name", type=click.Choice(["sglang", "flashinfer-v2"]), default="sglang", show_default=True,
              help="The reader to check for: SGLang's rank files, or FlashInfer's managed store (needs --env-from: "
                   "its directory is named by the serving environment).")
@env_from_option
@click.option("--strict", is_flag=True, help="Exit 1 on any miss (fail the build before a slow boot does).")
@targets_option
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
    layout = default_layout()
    fingerprint = Fingerprint.load(env_from) if env_from else None
    if targets_file:
        from .targetscmd import check_targets

        check_targets(ctx, out, targets_file, kw, store_url, layout_name, fingerprint, strict)
        return
    kw = apply_serving_command(ctx, kw, out)
    request = request_from(kw).for_target(fingerprint)
    root = str(resolve_root(kw["cache_dir"], must_exist=False).path) if store_url is None else kw["cache_dir"]
    checks = []
    for r in request.workers():
        plan = build_plan(r, root)
        report = run_check(plan, layout, layout_name, store_url, fingerprint, kw["cache_dir"])
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
                out.line(f"OK: {who}{report.where}: {report.rank_files} rank files, {report.keys_checked} startup "
                         "lookups, all present")
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


def run_check(plan, layout, layout_name: str, store_url: str | None, fingerprint, cache_dir: str | None) -> CheckReport:
    """One target's check: the tree, a store, or FlashInfer's v2 store."""
    eid = plan.entry_id
    report = CheckReport(str(eid), str(plan.key_dir) if store_url is None else f"{store_url} {eid}", plan.autotunes)
    if plan.autotunes and layout_name == "flashinfer-v2":
        if fingerprint is None or store_url is not None:
            raise UsageError("--layout flashinfer-v2 checks a local store against --env-from (the serving image's "
                             "fingerprint names its directory)")
        from autotune_cache.check import check_v2_store
        from autotune_cache.registry import get_layout

        v2root = cache_dir or get_layout("flashinfer-v2").default_root().path
        check_v2_store(plan, report, fingerprint, v2root)
    elif plan.autotunes:
        if store_url is None:
            _check_tree(plan, layout, report, fingerprint)
        else:
            _check_store(plan, layout, report, fingerprint, store_url)
    return report


def _check_tree(plan, layout, report: CheckReport, fingerprint) -> None:
    from autotune_cache.tree.scan import scan_cache

    kdir = plan.key_dir
    if not kdir.is_dir():
        root = plan.cache_root
        info = scan_cache(root) if root.exists() else None
        candidates = [Candidate(e.id, e.manifest.key_fields if e.manifest else None, e.gpu)
                      for e in (info.entries if info else ())]
        why = nearest_difference(plan, layout, candidates)
        report.misses.append(f"no entry at {kdir}" + (f": {why}" if why else " (and no other entry to compare with)"))
        return
    report.found = True
    files = {}
    for name in plan.rank_files:
        try:
            files[name] = read_regular_file(kdir / name)
        except OSError:
            continue
    check_files(plan, layout, report, files, fingerprint)


def _check_store(plan, layout, report: CheckReport, fingerprint, url: str) -> None:
    from autotune_cache.plan.keys import KeyFields
    from autotune_cache.tree.store import Store

    store = Store(url)
    rec = store.record(layout.name, plan.entry_id)
    if rec is None:
        candidates = []
        try:
            records = store.records(layout.name)
        except Exception:  # noqa: BLE001 - an HTTP store may not list; the miss stands without a neighbour
            records = []
        for r in records:
            kf = None
            if r.key_fields:
                try:
                    kf = KeyFields.from_dict(r.key_fields)
                except ValueError:
                    kf = None
            candidates.append(Candidate(r.id, kf, r.gpu))
        why = nearest_difference(plan, layout, candidates)
        report.misses.append(f"no entry {plan.entry_id} in {store}" + (f": {why}" if why else ""))
        return
    report.found = True
    check_files(plan, layout, report, files_of_bundle(store.fetch(rec), layout, plan.entry_id), fingerprint)
