"""``push`` and ``pull``: entries to and from a remote store (s3://, gs://, file://, https://)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.errors import ExitCode, FiAutotuneError, UsageError
from autotune_cache.registry import layouts
from autotune_cache.tree.pull import PullRefused, pull, select_records
from autotune_cache.tree.scan import scan_cache
from autotune_cache.tree.store import Store, bundle_of
from autotune_cache.tree.storehouse import sweep_temps, unseal
from autotune_cache.tree.storerecord import is_store_url

from .output import Output
from .params import (
    archive_layout_option, cache_dir_option, entry_filter, env_from_option, filter_options, json_option, resolve_root,
    timeout_option,
)
from .serving import build_plan, machine_of, request_from, serving_options
from .transfer import dry_run_listing, exportable
from .tree import recover_journals_quietly


def _store_and_refs(args: tuple[str, ...], verb: str) -> tuple[str, tuple[str, ...]]:
    """The one store URL among ``args`` and the entry ids around it. URL first, as ``git push
    <remote> <ref>``; the old ``ID... URL`` order still works: a URL has ``://``, an id never."""
    urls = [a for a in args if is_store_url(a)]
    if len(urls) != 1:
        paths = [a for a in args if a.startswith(("/", "./", "../", "~")) or Path(a).is_dir()]
        hint = f" (a directory is a file:// store: {verb} file://{Path(paths[0]).expanduser().resolve()})" if paths else ""
        raise UsageError(f"give exactly one store URL (s3://, gs://, file://) besides the entry ids{hint}")
    return urls[0], tuple(a for a in args if a != urls[0])


@click.command("push")
@click.argument("args", nargs=-1, required=True, metavar="URL [ID]...")
@cache_dir_option
@archive_layout_option
@filter_options
@click.option("--include-incomplete", is_flag=True, help="Also push incomplete entries, and unverified ones (no manifest counts their rank files) (warned).")
@click.option("--read-only", "seal", is_flag=True,
              help="Seal the store after this push: it is marked read-only and later pushes, rm and prune are refused.")
@click.option("--unseal", is_flag=True,
              help="Only mark a sealed store writable again (the inverse of --read-only) and push nothing: a step of "
                   "its own, so that no push lands in a sealed store by accident.")
@click.option("--dry-run", is_flag=True, help="Print what would be pushed; change nothing.")
@timeout_option
@json_option
def push_cmd(args, cache_dir, layout, model, versions, arch, status, older_than, unused_for, include_incomplete, seal,
             unseal, dry_run, as_json):
    """Publish complete entries (all, the named ones, or those the filters select) to a store:
    `fi-autotune push s3://bucket/caches [ID]...`.

    Each entry becomes one reproducible bundle named by its sha256, uploaded before its index
    record is published: readers never see a partial bundle, and a push killed midway leaves
    nothing visible (run it again; its temp files are removed by the next push). Credentials
    come from the backend's own configuration (AWS_* variables, profiles, workload identity;
    AWS_ENDPOINT_URL for S3-compatible servers).
    """
    out = Output(as_json)
    url, refs = _store_and_refs(args, "push")
    if unseal:
        return _unseal(out, url, refs, seal)
    root = resolve_root(cache_dir, must_exist=True, layout=layout)
    store = Store(url)
    store.check_writable()
    recover_journals_quietly(root.path, layout)
    info = scan_cache(root.path, layout)
    entries = info.resolve(refs) if refs else list(info.entries)
    flt = entry_filter(model, versions, arch, status, older_than, unused_for)
    now = time.time()
    chosen = exportable(out, [e for e in entries if flt.reasons(e, now) is not None], include_incomplete)
    if not chosen:
        raise FiAutotuneError("nothing to push")
    if dry_run:
        return dry_run_listing(out, "push", [(str(e.id), e.size_on_disk) for e in chosen], str(store))
    swept, _ = sweep_temps(store)
    if swept:
        out.note(f"removed {swept} temp file(s) of an interrupted push from {store}")
    result = store.push(layout, [(e, bundle_of(layout, e)) for e in chosen], seal=seal)

    for entry_id in result.vanished:
        out.note(f"skipped {entry_id}: deleted or replaced while pushing")

    def human() -> None:
        for entry_id in result.pushed:
            out.line(f"pushed     {entry_id}")
        for entry_id in result.unchanged:
            out.line(f"unchanged  {entry_id}")
        out.line(f"{len(result.pushed)} pushed, {len(result.unchanged)} already there, "
                 f"{result.uploaded_bytes} bytes uploaded to {store}" + ("; store sealed read-only" if seal else ""))

    out.emit(human=human, data={"store": str(store), **result.to_dict(), "sealed": seal}, ids=list(result.pushed))


def _unseal(out: Output, url: str, refs: tuple[str, ...], seal: bool) -> None:
    if refs or seal:
        raise UsageError("--unseal only unseals: give the store URL alone (then push as usual)")
    store = Store(url)
    changed = unseal(store)
    out.emit(human=lambda: out.line(f"{store} is writable again" if changed else f"{store} was not sealed"),
             data={"store": str(store), "unsealed": changed})


def _local_gpu_name() -> str | None:
    """This machine's GPU model (NVML or nvidia-smi; no CUDA context, no torch), if any."""
    info = machine_of().detect_gpus()
    return info.names[0] if info.count else None


def _ids_from_serving_flags(layout, refs, kw, fingerprint, root, out):
    """The entry the serving flags map to ([] when the server would not autotune), or None
    when no serving flags were given."""
    if not (kw["model"] or kw["model_path"]):
        return None
    if not layout.key_from_serving_flags:
        named = ", ".join(n for n, lay in layouts().items() if lay.key_from_serving_flags)
        raise UsageError(f"serving flags name {named} entries only ({layout.name}'s key comes from the engine "
                         "itself): pull by id")
    if refs:
        raise UsageError("name entries by ID or by serving flags, not both")
    plan = build_plan(request_from(kw).for_target(fingerprint), str(root.path))
    if not plan.autotunes:
        out.note("the server would not autotune with these flags: nothing to pull")
        return []
    return [plan.entry_id]


@click.command("pull")
@click.argument("url")
@click.argument("refs", nargs=-1, metavar="[ID]...")
@serving_options
@archive_layout_option
@env_from_option
@click.option("--force", is_flag=True, help="Replace a different complete entry, or one tuned on another GPU model.")
@click.option("--any-env", is_flag=True, help="Pull bundles tuned on another GPU model or software stack too.")
@click.option("--dry-run", is_flag=True, help="Print which entries would be pulled; fetch and change nothing.")
@timeout_option
@json_option
def pull_cmd(url, refs, layout, env_from, force, any_env, dry_run, as_json, **kw):
    """Fetch entries from a store, verify each bundle's sha256, and import them all or none.

    Name them by ID, or by the serving flags (--model/--model-path and the server's flags:
    the entry those flags map to), or give neither to pull everything. A bundle tuned for
    another GPU model or environment than the target's (--env-from env.json, else this
    machine's GPU) is refused unless --any-env.
    """
    out = Output(as_json)
    store = Store(url)
    fingerprint = Fingerprint.load(env_from) if env_from else None
    root = resolve_root(kw["cache_dir"], must_exist=False, layout=layout)
    ids = _ids_from_serving_flags(layout, refs, kw, fingerprint, root, out)
    if ids == []:
        out.emit(human=lambda: None, data={"store": str(store), "imported": [], "unchanged": []})
        return
    if dry_run:
        records = select_records(store, layout, refs, ids)
        for line in store.unreadable:
            out.warn(line)
        return dry_run_listing(out, "pull", [(str(r.id), r.size) for r in records], str(store))
    try:
        pulled = pull(store, layout, root.path, refs=refs, ids=ids, fingerprint=fingerprint, any_env=any_env,
                      local_gpu=None if fingerprint is not None else _local_gpu_name(), force=force)
    except PullRefused as e:
        for rec, why in e.refused:
            out.error(f"{rec.id}: {why}")
        raise
    finally:
        for line in store.unreadable:  # index records left out: the others were pulled
            out.warn(line)
    if pulled.unchecked:
        out.note("no --env-from and no GPU here: the bundles' environment was not checked "
                 "(`fi-autotune check --env-from env.json` can do it later)")
    result = pulled.imported

    def human() -> None:
        for entry_id in result.imported:
            out.line(f"pulled     {entry_id}")
        for entry_id in result.unchanged:
            out.line(f"unchanged  {entry_id}")

    out.emit(human=human, data={"store": str(store), **result.to_dict()}, ids=list(result.imported))
    for entry_id, why in result.refused:
        out.error(f"{entry_id}: {why}")
    if result.refused:
        out.error(f"nothing was pulled ({len(result.refused)} entries refused)")
        raise click.exceptions.Exit(int(ExitCode.FAILURE))
