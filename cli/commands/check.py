"""``check``: will the engine launched with these flags find and use its cache? (no GPU)

One target (the flags, or the serving command after ``--``) and a targets file are checked by
the same code, worker by worker (a speculative target's draft worker is an entry of its own),
and report in one shape: a fleet's gate says what each of its targets' own ``check`` says.
"""

from __future__ import annotations

import json

import click

from autotune_cache import registry
from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.check import CheckReport, run_check
from autotune_cache.errors import ExitCode, UsageError
from autotune_cache.tree.layouts.values import DEFAULT_LAYOUT_NAME
from autotune_cache.tune.session.fleetplan import (COMMAND_LINE, FleetError, FleetMember, load_fleet, member_fields,
                                                  shared_entries)

from ..output import Output
from ..params import LayoutName, env_from_option, json_option, targets_option, timeout_option
from ..roots import rooting
from ..serving import (build_plan, engine_options, fold_serving_command, machine_of, request_from,
                      serving_command_argument, serving_options)
from ..targets import reject_serving_flags, report_errors


def _readers() -> list[str]:
    """The layouts ``check`` reads: every engine's that checks, and FlashInfer's managed store."""
    return [name for name in registry.layouts()
            if (engine := registry.engine_of_layout(name)) is None or engine.checks]


@click.command("check")
@serving_options
@click.option("--store", "store_url", default=None, help="Check a store (s3://, gs://, file://, https://) instead of a tree.")
@click.option("--layout", "layout_name", type=LayoutName(_readers), default=DEFAULT_LAYOUT_NAME, show_default=True,
              help="The reader to check for: SGLang's rank files, FlashInfer's managed store (needs --env-from: "
                   "its directory is named by the serving environment), or vLLM's files (vllm, vllm-dir; a "
                   "single-rank vLLM: its managed store, with --env-from).")
@engine_options
@env_from_option
@click.option("--strict", is_flag=True, help="Exit 1 on any miss, and on anything that cannot be checked (fail the "
                                             "build before a slow boot does).")
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
    Exit 0 unless `--strict` and something would miss (or cannot be checked: a flag not
    understood, a field of the environment unknown). With --targets, every target of a targets
    file, each worker checked as its own `check` would (the gate an image build runs).
    """
    out = Output(as_json)
    reader = registry.get_layout(layout_name)
    fingerprint = Fingerprint.load(env_from) if env_from else None
    if targets_file:
        reject_serving_flags(ctx)
        # --cache-dir and --env-from apply to every target, as to its own check; targets that are one
        # entry are each checked (once where their plans are the same) and reported under each name
        fleet = load_fleet(targets_file, rooting(kw["cache_dir"]), kw["arch"], machine=machine_of(ctx),
                           fingerprint=fingerprint, shared_ok=True)
        members, errors, named, unknown_flags = fleet.members, list(fleet.errors), True, ()
    else:
        kw, layout_name = fold_serving_command(ctx, kw, out, "layout_name")
        reader = registry.get_layout(layout_name)
        # An engine's layout names the engine whose calls are checked; a layout of no engine's
        # (FlashInfer's managed store) is read with the default engine's (``build_request``).
        request = request_from(kw, layout_name).for_target(fingerprint)
        members = [FleetMember(COMMAND_LINE, r.worker, build_plan(r, kw["cache_dir"]), ()) for r in request.workers()]
        errors, named, unknown_flags = [], False, tuple(kw.get("not_understood") or ())
    checks = []
    failed = {e.target.source for e in errors}
    done: dict[str, CheckReport] = {}  # one check per distinct plan: targets that are one entry
    for m in members:
        if m.target.source in failed:
            continue
        same = json.dumps(m.plan.to_dict(), sort_keys=True, default=str)
        try:
            report = done.get(same) or run_check(m.plan, reader, store_url, fingerprint, kw["cache_dir"],
                                                 strict=strict)
            done[same] = report
        except UsageError as e:
            if not named:
                raise
            errors.append(FleetError(m.target, str(e)))
            failed.add(m.target.source)
            continue
        # A flag whose effect on the autotune path is not known: the verdict cannot be trusted.
        unknown = [f"the serving command's {flag} is not understood: fi-autotune cannot tell what it changes"
                   for flag in unknown_flags]
        (report.misses if strict else report.warnings).extend(unknown)
        checks.append((m, report, len(unknown) if strict else 0))
    checks = [c for c in checks if c[0].target.source not in failed]
    _emit(out, checks, errors, named, strict, shared_entries([m for m, _, _ in checks]) if named else {})
    report_errors(out, errors)
    if strict and not all(r.ok for _, r, _ in checks):
        raise click.exceptions.Exit(int(ExitCode.FAILURE))


def _emit(out: Output, checks: list[tuple[FleetMember, CheckReport, int]], errors: list[FleetError],
          named: bool, strict: bool, shared: dict[str, list[FleetMember]]) -> None:
    targets = list(dict.fromkeys([m.target.source for m, _, _ in checks] + [e.target.source for e in errors]))
    bad = {m.target.source for m, r, _ in checks if not r.ok} | {e.target.source for e in errors}
    sharing = {id(m): [o.name for o in ms if o is not m] for ms in shared.values() for m in ms}

    def human() -> None:
        if named:
            _human_fleet(out, checks, errors, len(targets), len(bad) - len(errors))
            for eid, ms in shared.items():
                out.note(f"one entry, {eid}: {', '.join(m.name for m in ms)} (the engine reads the same files; "
                         "each target reported)")
        else:
            _human_one(out, checks)

    out.emit(human=human, data=lambda: {
        "ok": not bad, "strict": strict,
        "workers": [{**member_fields(m, named), **r.to_dict(), **({"same_entry_as": sharing.get(id(m), [])}
                                                                 if named else {})} for m, r, _ in checks],
        "errors": [e.to_dict() for e in errors],
        "targets": len(targets), "covered": len(targets) - len(bad), "missing": len(bad)})


def _human_one(out: Output, checks) -> None:
    for m, report, n_unknown in checks:
        who = "" if len(checks) == 1 else f"{m.worker} worker: "
        for w in report.warnings:
            if "is not understood: fi-autotune cannot tell" not in w:  # printed once, by the command parser
                out.note(f"warning: {who}{w}")
        for miss in report.misses:
            out.line(f"MISS: {who}{miss}")
        if report.ok and not report.autotunes:
            out.line(f"OK: {who}{'; '.join(m.plan.reasons)}")
        elif report.ok:
            files = m.plan.layout_obj.checked_words(report.rank_files)
            out.line(f"OK: {who}{report.where}: {files}{report.keys_checked} startup lookups, all present")
        elif len(report.misses) > n_unknown:
            out.line(f"{len(report.misses)} miss(es): {who}the engine would tune at startup")
        else:
            out.line(f"{len(report.misses)} miss(es): {who}not confirmed: the command has flags fi-autotune "
                     "does not understand")


def _human_fleet(out: Output, checks, errors: list[FleetError], total: int, missing: int) -> None:
    # A reason cut to fit a column is a reason lost ("the nearest entry, 0."): the table says
    # which workers miss, and each miss follows it, whole, on its own line.
    rows = []
    for m, r, _ in checks:
        state = "not tuned by the engine" if not r.autotunes else "OK" if r.ok else f"MISS ({len(r.misses)})"
        rows.append([m.name, m.plan.id_str if r.autotunes else "-", state])
    rows += [[e.target.name, "-", "ERROR"] for e in errors]
    out.table(["TARGET", "ID", "RESULT"], rows)
    for m, r, _ in checks:
        for w in r.warnings:
            out.note(f"warning: {m.name}: {w}")
        for miss in r.misses:
            out.line(f"MISS: {m.name}: {miss}")
    out.line(f"{total - missing - len(errors)} of {total} targets covered"
             + (f"; {missing} would tune at startup" if missing else "")
             + (f"; {len(errors)} could not be checked" if errors else ""))
