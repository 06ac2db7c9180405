"""``pull``: entries from a remote store (s3://, gs://, file://, https://) into the tree.

One path for the run and its ``--dry-run``: both fetch, verify and judge every bundle and ask
the tree what it would refuse (``tree.store.pull.pull``), so a preview never promises what the run
refuses, and both exit alike.
"""

from __future__ import annotations

import time

import click

from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.check import store_miss
from autotune_cache.errors import ExitCode, FiAutotuneError, UsageError
from autotune_cache.plan.options import GIVEN_OPTIONS
from autotune_cache.registry import layouts
from autotune_cache.tree.store.archive import ImportResult
from autotune_cache.tree.store.pull import PullRefused, pull, select_records
from autotune_cache.tree.store.store import Store
from autotune_cache.tree.store.storehouse import record_views

from ..output import Output
from ..progress import TransferProgress
from ..filters import FILTER_HELP, entry_filter, size_filters
from ..params import ARCHS, DURATION, STATUSES, VERSIONS, archive_layout_option, env_from_option, json_option, new_tree_option, timeout_option
from ..roots import resolve_root
from ..serving import build_plan, machine_of, request_from, serving_options
from ..transferring import dry_run_lines

#: Serving options that are filters too when no model is given (as ``ls URL`` takes them).
FILTERING = ("arch", "flashinfer_version")
#: Serving options that are not part of naming an entry (where the tree is).
NEUTRAL = ("cache_dir",)


def _local_gpu_name() -> str | None:
    """This machine's GPU model (NVML or nvidia-smi; no CUDA context, no torch), if any."""
    info = machine_of().detect_gpus()
    return info.names[0] if info.count else None


def _plan_from_serving_flags(layout, refs, kw, fingerprint, root):
    """The plan the serving flags map to, or None when no model was given. Without a model the
    other serving flags name nothing: a flag pull would ignore is refused (exit 2)."""
    if not (kw["model"] or kw["model_path"]):
        ctx = click.get_current_context()
        given = [o.spelling for o in GIVEN_OPTIONS if o.name not in FILTERING + NEUTRAL and o.name in kw
                 and ctx.get_parameter_source(o.name) == click.core.ParameterSource.COMMANDLINE]
        if given:
            raise UsageError(f"{', '.join(given)} {'names' if len(given) == 1 else 'name'} an entry only with --model or --model-path; without them pull "
                             "selects by id and by --arch, --flashinfer-version, --status, --older-than, "
                             "--larger-than, --smaller-than (as `ls URL`)")
        return None
    if not layout.key_from_serving_flags:
        named = ", ".join(n for n, lay in layouts().items() if lay.key_from_serving_flags)
        raise UsageError(f"serving flags name {named} entries only ({layout.name}'s key comes from the engine "
                         "itself): pull by id")
    if refs:
        raise UsageError("name entries by ID or by serving flags, not both")
    return build_plan(request_from(kw).for_target(fingerprint), str(root.path))


def _comma_values(kind, value: str | None) -> tuple:
    """``--arch``/``--flashinfer-version`` as a filter: checked (and comma-split) as ``ls``'s."""
    if value is None:
        return ()
    try:
        return kind.convert(value, None, None)
    except click.BadParameter as e:
        raise UsageError(e.message) from None


def _selected(store, layout, refs, plan, kw, filters: dict, fingerprint):
    """The store's records pull takes: the plan's entry, the named ones or all, then those the
    filters keep (as ``ls URL`` filters: --status stale is judged against ``--env-from``)."""
    if plan is not None and store.record(layout.name, plan.entry_id) is None:
        raise FiAutotuneError(store_miss(plan, layout, store))
    records = select_records(store, layout, refs, None if plan is None else [plan.entry_id])
    by_plan = plan is not None  # the plan's arch and version are its own, not filters
    flt = entry_filter(None, () if by_plan else _comma_values(VERSIONS, kw["flashinfer_version"]),
                       () if by_plan else _comma_values(ARCHS, kw["arch"]), filters["status"], filters["older_than"],
                       None, larger_than=filters["larger_than"], smaller_than=filters["smaller_than"])
    now = time.time()
    kept = [v.record for v in record_views(records, fingerprint) if flt.reasons(v, now) is not None]
    if not kept:
        raise FiAutotuneError(f"nothing to pull: none of the {len(records)} selected entries of {store} matches "
                              "the filters")
    return kept


@click.command("pull")
@click.argument("url")
@click.argument("refs", nargs=-1, metavar="[ID]...")
@serving_options
@archive_layout_option
@click.option("--status", multiple=True, type=STATUSES, help=FILTER_HELP["status"])
@click.option("--older-than", type=DURATION, default=None, help="Only entries pushed longer ago than this (30d).")
@size_filters
@env_from_option
@click.option("--force", is_flag=True, help="Replace a different complete entry, or one tuned on another GPU model.")
@click.option("--only-compatible", is_flag=True,
              help="Leave out the bundles tuned for another GPU model or environment and pull the others.")
@click.option("--any-env", is_flag=True, help="Pull bundles tuned on another GPU model or software stack too.")
@click.option("--dry-run", is_flag=True,
              help="Fetch, verify and judge every bundle as the pull does; print what it would pull, change nothing, "
                   "and exit as it would.")
@new_tree_option
@timeout_option
@json_option
def pull_cmd(url, refs, layout, status, older_than, larger_than, smaller_than, env_from, force, only_compatible,
             any_env, dry_run, new_tree, as_json, **kw):
    """Fetch entries from a store, verify each bundle's sha256, and import them all or none.

    Name them by ID, or by the serving flags (--model/--model-path and the server's flags:
    the entry those flags map to), or give neither to pull everything; --arch,
    --flashinfer-version, --status, --older-than and the size filters select among them as
    `ls URL` does. A bundle tuned for another GPU model or environment than the target's
    (--env-from env.json, else this machine's GPU) is refused unless --only-compatible (leave
    it) or --any-env (take it).
    """
    out = Output(as_json)
    if only_compatible and any_env:
        raise UsageError("--only-compatible leaves out what --any-env takes: give one")
    store = Store(url)
    fingerprint = Fingerprint.load(env_from) if env_from else None
    root = resolve_root(kw["cache_dir"], must_exist=False, layout=layout, writes=True, new_tree=new_tree)
    plan = _plan_from_serving_flags(layout, refs, kw, fingerprint, root)
    if plan is not None and not plan.autotunes:
        out.note("the server would not autotune with these flags: nothing to pull")
        out.emit(human=lambda: None, data=_pull_data(store, dry_run, ImportResult(), ()))
        return
    bar = None
    try:
        filters = {"status": status, "older_than": older_than, "larger_than": larger_than, "smaller_than": smaller_than}
        records = _selected(store, layout, refs, plan, kw, filters, fingerprint)
        bar = TransferProgress(not as_json, sum(r.size for r in records), "pull")
        bar.fetching(store)
        pulled = pull(store, layout, root.path, records, fingerprint=fingerprint, any_env=any_env,
                      only_compatible=only_compatible, force=force, dry_run=dry_run,
                      local_gpu=None if fingerprint is not None else _local_gpu_name())
    except PullRefused as e:  # nothing pulled: --json says what was refused, as a refused import does
        out.emit(human=lambda: None, data=_pull_data(store, dry_run, ImportResult(
            refused=tuple((str(rec.id), why) for rec, why in e.refused)), ()))
        for rec, why in e.refused:
            out.error(f"{rec.id}: {why}")
        raise
    finally:
        if bar is not None:
            bar.close()
        for line in store.unreadable:  # index records left out: the others were judged
            out.warn(line)
    _report(out, store, pulled, {str(r.id): r.size for r in records}, dry_run)


def _pull_data(store: Store, dry_run: bool, result: ImportResult, left_out) -> dict:
    """``pull --json``, one object whatever happened (a dry run: the same, ``dry_run`` true)."""
    return {"store": str(store), "dry_run": dry_run, **result.to_dict(),
            "left_out": [{"entry": str(r.id), "reason": w} for r, w in left_out],
            "unreadable": list(store.unreadable)}  # records left out, named: a program sees what was not pulled


def _report(out: Output, store: Store, pulled, sizes: dict, dry_run: bool) -> None:
    """What was pulled (or would be), what was left out, what was refused; exit 1 on a refusal."""
    for rec, why in pulled.left_out:
        out.note(f"left out {rec.id}: {why}")
    if pulled.unchecked:
        out.note("no --env-from and no GPU here: the bundles' environment was not checked "
                 "(`fi-autotune check --env-from env.json` can do it later)")
    result = pulled.imported

    def human() -> None:
        if dry_run:
            for entry_id in result.unchanged:
                out.note(f"unchanged {entry_id}: already there")
            if not result.refused:
                dry_run_lines(out, "pull", [(i, sizes.get(i, 0)) for i in result.imported], str(store))
            return
        for entry_id in result.imported:
            out.line(f"pulled     {entry_id}")
        for entry_id in result.unchanged:
            out.line(f"unchanged  {entry_id}")

    # A dry run reports what the pull would (the same object, ``dry_run`` true) and exits as it would.
    out.emit(human=human, data=_pull_data(store, dry_run, result, pulled.left_out), ids=list(result.imported))
    for entry_id, why in result.refused:
        out.error(f"{entry_id}: {why}")
    if result.refused:
        would = "would be" if dry_run else "was"
        out.error(f"nothing {would} pulled ({len(result.refused)} entries refused)")
        raise click.exceptions.Exit(int(ExitCode.FAILURE))
