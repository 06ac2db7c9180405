"""``rm``: delete named entries (in a tree or a store); a re-run of an interrupted rm finishes it."""

from __future__ import annotations


import click

from autotune_cache.errors import UsageError
from autotune_cache.tree.delete import plan_rm
from autotune_cache.tree.store.storehouse import plan_store_delete
from autotune_cache.tree.store.storerecord import is_store_url
from autotune_cache.tree.crashsafe.recovery import in_flight

from ..deleting import dry_run_option, run_delete, store_at, yes_option
from ..output import Output
from ..params import (
    cache_dir_option, json_option, layout_option, quiet_option, timeout_option,
)
from ..scanning import scan_trees


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
        return run_delete(plan_store_delete(store_at(refs[0]), refs=refs[1:]), out, dry_run, yes, named=True)
    resumed: dict = {}  # id(info) -> {entry id: trash finding}

    def gone(ref, infos) -> bool:
        for info in infos:
            hit = in_flight(info, ref)
            if hit is not None:
                resumed.setdefault(id(info), (info, {}))[1][hit[0]] = hit[1]
                return True
        return False

    recovered: list[str] | None = None if dry_run else []
    found = scan_trees(cache_dir, layouts, refs, gone=gone, recovered=recovered)
    infos = {id(info): info for _, info in found}
    infos.update({k: info for k, (info, _) in resumed.items()})
    if len(infos) > 1:
        raise UsageError("rm works on one layout at a time: these ids are in " + ", ".join(
            sorted({info.layout.name for info in infos.values()})))
    (info,) = infos.values()
    plan = plan_rm(info, tuple(str(e.id) for e, _ in found), resumed.get(id(info), (None, {}))[1])
    run_delete(plan, out, dry_run, yes, named=True, recovered=recovered or ())
