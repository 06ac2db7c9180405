"""``prune``: select entries by age, use, version or size, show the plan, confirm, delete each in one step."""

from __future__ import annotations


import click

from autotune_cache.errors import RootMissing, UsageError
from autotune_cache.humanize import parse_size
from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.autotuner.installed import installed_flashinfer_version
from autotune_cache.tree.delete import plan_prune
from autotune_cache.tree.select import Reader, model_hint
from autotune_cache.tree.store.storehouse import plan_store_delete
from autotune_cache.tree.scanner.scan import scan_cache
from autotune_cache.tree.crashsafe.recovery import recover_journals

from ..deleting import dry_run_option, run_delete, store_at, yes_option
from ..output import PROG, Output
from ..filters import entry_filter, filter_options, keep_latest_version, size_filters, staleness_fingerprint
from ..params import cache_dir_option, check_env_option, env_from_option, json_option, layout_option, quiet_option, timeout_option
from ..roots import trees


@click.command("prune")
@click.argument("store", required=False, metavar="[STORE_URL]")
@cache_dir_option
@layout_option
@filter_options
@size_filters
@click.option("--other-versions", is_flag=True, help="Entries of every FlashInfer version but the installed one.")
@click.option("--keep-latest", type=int, default=None, metavar="N",
              help="Per deployment (same arch and key: every serving flag but the FlashInfer version), keep the N "
                   "(at least 1) best entries: first the installed FlashInfer version (or --env-from's), the only "
                   "one the engine reads; then complete before unverified before incomplete; then the newest "
                   "version; then the most recently modified. Corrupt and diverged entries, read by no engine, rank "
                   "below every other (prune's one eviction order, as --max-size's).")
@click.option("--missing-ok", is_flag=True,
              help="A cache root that does not exist is nothing to prune (exit 0), not an error: for cron jobs and "
                   "image builds on nodes that have not cached anything yet.")
@click.option("--max-size", "max_size", default=None, metavar="SIZE",
              help="A size budget (50G, 500M, 10GiB; a unit is required, 0 refused): evict until the tree fits, as "
                   "ccache/sccache do, what no engine here reads first - corrupt, diverged, other FlashInfer versions, "
                   "other archs (known from --env-from), stale - and the installed version's complete entries last; "
                   "within each, the least recently used first (by access time; by last write where the mount keeps "
                   "none, or where access times cannot be trusted, with a note). With other filters or --keep-latest, "
                   "only entries they select are evicted; a budget that cannot be met says so.")
@env_from_option
@check_env_option
@dry_run_option
@yes_option
@timeout_option
@json_option
@quiet_option
def prune_cmd(store, cache_dir, layouts, model, model_glob, versions, arch, status, older_than, unused_for, larger_than, smaller_than,
              other_versions, keep_latest, missing_ok, max_size, env_from, check_env, dry_run, yes, as_json, quiet):
    """Delete entries matching every given filter, and leftovers of interrupted writes; with
    STORE_URL (s3://, gs://, file://), the store's published entries (--older-than: by push time).

    Each entry is removed in one step, only if it is unchanged since the plan was printed, not
    locked by a writer, and holds nothing but cache files; the rest is left and reported. In a
    store, each index record goes before its bundle (readers never meet a record without its
    bundle); a sealed store is refused.
    """
    out = Output(as_json, quiet)
    budget = None if max_size is None else parse_size(max_size)
    if budget == 0:  # a slip (a lost digit, an unset variable's default) must not empty the tree
        raise UsageError(f"--max-size {max_size} keeps no entry: it would delete every entry; to empty the tree, "
                         f"name them: {PROG} rm $({PROG} ls -q)")
    if store is not None:
        if keep_latest is not None or other_versions or check_env or max_size is not None:
            raise UsageError("--keep-latest, --max-size, --other-versions and --check-env work on a tree only")
        flt = entry_filter(model, versions, arch, status, older_than, unused_for, larger_than=larger_than,
                           smaller_than=smaller_than, model_glob=model_glob)
        fp = Fingerprint.load(env_from) if env_from else None
        return run_delete(plan_store_delete(store_at(store), flt, fingerprint=fp), out, dry_run, yes)
    if len(layouts) > 1 or any(len(v) > 1 for v in layouts):
        raise UsageError("prune works on one layout at a time: give one --layout")
    try:
        ((layout, root),) = trees(cache_dir, layouts)
    except RootMissing as e:  # a fresh node: asked for, nothing to prune is not a failure (cron)
        if not missing_ok:
            raise
        why = str(e)
        out.emit(human=lambda: out.line(f"nothing to prune: {why}"), ids=[],
                 data={"dry_run": dry_run, "plan": None, "result": None, "root_missing": why})
        return
    other = None
    if other_versions:
        other = installed_flashinfer_version()
        if other is None:
            raise UsageError("--other-versions needs flashinfer-python installed to know the current version")
    flt = entry_filter(model, versions, arch, status, older_than, unused_for, other, larger_than=larger_than,
                       smaller_than=smaller_than, model_glob=model_glob)
    fingerprint = staleness_fingerprint(env_from, check_env, flt, out)
    # a writer finishes what killed writers left, once, before it reads (a dry run writes nothing)
    recovered = [] if dry_run else recover_journals(layout, root.path)
    info = scan_cache(root.path, layout, fingerprint=fingerprint)
    reader = None
    if keep_latest is not None or budget is not None:  # what the engine here reads goes last (select.evict_class)
        reader = Reader(keep_latest_version(env_from), fingerprint.arch if fingerprint is not None else None,
                        "--env-from's" if env_from else "the installed one")
    plan = plan_prune(info, flt, keep_latest=keep_latest, reader=reader, scan_fingerprint=fingerprint,
                      max_size=budget)
    if plan.empty and (hint := model_hint(model, (e.model for e in info.entries))):
        out.note(hint)
    run_delete(plan, out, dry_run, yes, recovered=recovered)
