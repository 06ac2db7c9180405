"""``prune`` and ``rm``: plan, show the plan, confirm, delete each entry in one step."""

from __future__ import annotations

import sys

import click

from autotune_cache.errors import ExitCode, RootMissing, UsageError
from autotune_cache.humanize import parse_size
from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.autotuner.installed import installed_flashinfer_version
from autotune_cache.tree.delete import DeletePlan, describe_result, plan_prune, plan_rm
from autotune_cache.tree.store.store import Store
from autotune_cache.tree.store.storehouse import plan_store_delete
from autotune_cache.tree.store.storerecord import is_store_url
from autotune_cache.tree.scanner.scan import scan_cache
from autotune_cache.tree.crashsafe.recovery import in_flight, recover_journals

from .output import PROG, Output
from .params import (
    cache_dir_option, check_env_option, entry_filter, env_from_option, filter_options, json_option, layout_option,
    keep_latest_version, quiet_option, size_filters, staleness_fingerprint, timeout_option, trees,
)
from .tree import scan_trees

dry_run_option = click.option("--dry-run", is_flag=True, help="Print the plan and delete nothing.")
yes_option = click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")


def _run(plan: DeletePlan, out: Output, dry_run: bool, yes: bool, named: bool = False) -> None:
    """Print the plan; unless --dry-run, confirm and execute it; print what happened. ``named``
    (``rm``): the user asked for exactly these entries, so one left in place is a failure."""
    for note in getattr(plan, "notes", ()):  # in every mode: what the plan went by instead
        out.note(note)

    def human_plan() -> None:
        if plan.candidates:
            out.table(
                ["ID", "MODEL", "GPU", "SIZE", "STATUS", "WHY"],
                [[str(c.entry.id), c.entry.model or "-", c.entry.gpu_short, c.entry.size_on_disk_str,
                  c.entry.status.value, "; ".join(c.reasons)] for c in plan.candidates],
            )
        if plan.leftovers:
            out.line(f"{len(plan.leftovers)} leftover(s) of interrupted writes (staging, trash or temp files)")
        for e in getattr(plan, "locked_temps", ()):
            out.line(f"temp files of an interrupted write in {e.id} (removed under its lock)")
        for entry_id, why in plan.left_alone:
            out.note(f"left {entry_id}: {why}")
        for entry_id in getattr(plan, "already_deleted", ()):
            out.note(f"{entry_id}: already deleted (by an interrupted rm or prune; what it left goes now)")
        if plan.empty:
            out.line("Nothing to delete.")
        else:
            verb = "Would free" if dry_run else "Will free"
            n = len(plan.candidates)
            out.line(f"{verb} {plan.expected_freed_size_str} ({n} {'entry' if n == 1 else 'entries'}).")

    if dry_run or plan.empty:
        out.emit(human=human_plan, data={"dry_run": dry_run, "plan": plan.to_dict(), "result": None},
                 ids=[str(c.entry.id) for c in plan.candidates])
        if named and plan.left_alone and not dry_run:
            raise click.exceptions.Exit(int(ExitCode.FAILURE))
        return
    plan.check_writable()
    out.human(human_plan)
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError("refusing to delete without confirmation on a non-interactive input; pass -y")
        if not click.confirm("Delete these?", default=False, err=True):
            # Declining is an answer, not an interruption (Ctrl-C at the prompt exits 130).
            click.echo(f"{PROG}: aborted: nothing was changed", err=True)
            raise click.exceptions.Exit(int(ExitCode.FAILURE))
    result = plan.execute()

    def human_result() -> None:
        out.line(describe_result(result))
        for note in result.recovered:
            out.note(note)
        for entry_id, why in result.skipped:
            out.note(f"left {entry_id}: {why}")

    out.emit(human=human_result, data={"dry_run": False, "plan": plan.to_dict(), "result": result.to_dict()},
             ids=[e for e, _ in result.deleted])
    for path, err in result.errors:
        out.error(f"{path}: {err}")
    if result.errors or (named and result.skipped):
        raise click.exceptions.Exit(int(ExitCode.FAILURE))


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
                   "version; then the most recently modified.")
@click.option("--missing-ok", is_flag=True,
              help="A cache root that does not exist is nothing to prune (exit 0), not an error: for cron jobs and "
                   "image builds on nodes that have not cached anything yet.")
@click.option("--max-size", "max_size", default=None, metavar="SIZE",
              help="A size budget (50G, 500M, 10GiB; a unit is required, 0 refused): evict least recently used "
                   "entries (by access time; by last write where the mount keeps none, after those, or for every "
                   "entry where access times cannot be trusted, with a note) until the tree fits, as ccache/sccache do. "
                   "With other filters, only entries they select are evicted.")
@env_from_option
@check_env_option
@dry_run_option
@yes_option
@timeout_option
@json_option
@quiet_option
def prune_cmd(store, cache_dir, layouts, model, versions, arch, status, older_than, unused_for, larger_than, smaller_than,
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
                           smaller_than=smaller_than)
        fp = Fingerprint.load(env_from) if env_from else None
        return _run(plan_store_delete(_store(store), flt, fingerprint=fp), out, dry_run, yes)
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
                       smaller_than=smaller_than)
    fingerprint = staleness_fingerprint(env_from, check_env, flt, out)
    if not dry_run:  # a writer finishes what killed writers left, once, before it reads (a dry run writes nothing)
        for done in recover_journals(layout, root.path):
            out.note(done)
    info = scan_cache(root.path, layout, fingerprint=fingerprint)
    prefer = keep_latest_version(env_from) if keep_latest is not None else None
    plan = plan_prune(info, flt, keep_latest=keep_latest, prefer_version=prefer, scan_fingerprint=fingerprint,
                      max_size=budget)
    _run(plan, out, dry_run, yes)


@click.command("rm")
@click.argument("refs", nargs=-1, required=True, metavar="[STORE_URL] ID...")
@cache_dir_option
@layout_option
@dry_run_option
@yes_option
@timeout_option
@json_option
@quiet_option
def rm_cmd(refs, cache_dir, layouts, dry_run, yes, as_json, quiet):
    """Delete the named entries (ids as `ls` prints them, unique keys, or entry dirs); with a
    STORE_URL first (s3://, gs://, file://), the named entries published in that store.

    An unknown or ambiguous name stops the command before anything is deleted. A re-run of an
    interrupted `rm A B` finishes it: an entry the killed run had already deleted is reported
    "already deleted" (not an error), and the rest are deleted.
    """
    out = Output(as_json, quiet)
    if any(is_store_url(r) for r in refs[1:]):
        raise UsageError("give the store URL first: rm URL ID...")
    if is_store_url(refs[0]):
        if len(refs) == 1:
            raise UsageError("name the entries to delete from the store: rm URL ID...")
        return _run(plan_store_delete(_store(refs[0]), refs=refs[1:]), out, dry_run, yes, named=True)
    resumed: dict = {}  # id(info) -> {entry id: trash finding}

    def gone(ref, infos) -> bool:
        for info in infos:
            hit = in_flight(info, ref)
            if hit is not None:
                resumed.setdefault(id(info), (info, {}))[1][hit[0]] = hit[1]
                return True
        return False

    found = scan_trees(cache_dir, layouts, refs, gone=gone, finish_writes=not dry_run)
    infos = {id(info): info for _, info in found}
    infos.update({k: info for k, (info, _) in resumed.items()})
    if len(infos) > 1:
        raise UsageError("rm works on one layout at a time: these ids are in " + ", ".join(
            sorted({info.layout.name for info in infos.values()})))
    (info,) = infos.values()
    plan = plan_rm(info, tuple(str(e.id) for e, _ in found), resumed.get(id(info), (None, {}))[1])
    _run(plan, out, dry_run, yes, named=True)


def _store(url: str) -> Store:
    """A store to delete from (``rm URL``, ``prune URL``): one that exists."""
    store = Store(url)
    store.require()
    return store
