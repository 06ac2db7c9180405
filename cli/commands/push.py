"""``push``: entries to a remote store (s3://, gs://, file://, https://); ``pull`` is in pull.py."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import click

from autotune_cache.errors import FiAutotuneError, UsageError
from autotune_cache.tree.scanner.scan import scan_cache
from autotune_cache.tree.store.store import PushResult, Store, bundle_of
from autotune_cache.tree.store.storehouse import unseal
from autotune_cache.tree.store.storerecord import is_store_url
from autotune_cache.tree.store.storesweep import sweep_store

from ..output import Output
from ..progress import TransferProgress
from ..filters import entry_filter, filter_options
from ..params import archive_layout_option, cache_dir_option, json_option, timeout_option
from ..roots import resolve_root
from ..transferring import dry_run_extras, dry_run_lines, exportable


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
def push_cmd(args, cache_dir, layout, model, model_glob, versions, arch, status, older_than, unused_for, include_incomplete, seal,
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
    info = scan_cache(root.path, layout)
    entries = info.resolve(refs) if refs else list(info.entries)
    flt = entry_filter(model, versions, arch, status, older_than, unused_for, model_glob=model_glob)
    now = time.time()
    chosen = exportable(out, [e for e in entries if flt.reasons(e, now) is not None], include_incomplete)
    if not dry_run:  # a writer sweeps what killed pushes and deletes left, even with nothing to push
        for note in sweep_store(store).notes(store):
            out.note(note)
    if not chosen:
        raise FiAutotuneError("nothing to push")
    rows = [(str(e.id), e.size_on_disk) for e in chosen] if dry_run else None
    if dry_run:  # each bundle made and compared as the push does; nothing is written
        result = _would_push(store, layout, chosen)
    else:
        bundles = [(e, bundle_of(layout, e)) for e in chosen]
        bar = TransferProgress(not as_json, sum(len(b or b"") for _, b in bundles), "push")
        result = store.push(layout, bar.counting(bundles), seal=seal)
    if not seal and not dry_run:  # the bundles our new records replaced (an entry pushed again with other bytes)
        for note in sweep_store(store).notes(store):
            out.note(note)

    for entry_id in result.vanished:
        out.note(f"skipped {entry_id}: deleted or replaced while pushing")

    def human() -> None:
        if dry_run:
            for entry_id in result.unchanged:
                out.note(f"unchanged {entry_id}: already there")
            return dry_run_lines(out, "push", [r for r in rows if r[0] in result.pushed], str(store),
                                 upload=result.uploaded_bytes)
        for entry_id in result.pushed:
            out.line(f"pushed     {entry_id}")
        for entry_id in result.unchanged:
            out.line(f"unchanged  {entry_id}")
        out.line(f"{len(result.pushed)} pushed, {len(result.unchanged)} already there, "
                 f"{result.uploaded_bytes} bytes uploaded to {store}" + ("; store sealed read-only" if seal else ""))

    out.emit(human=human, data={"store": str(store), **result.to_dict(), "sealed": seal,
                                "dry_run": dry_run, **dry_run_extras(rows, store)}, ids=list(result.pushed))


def _would_push(store: Store, layout, chosen) -> PushResult:
    """What ``store.push`` would do, decided as it decides (a record naming these very bytes, its
    bundle there: unchanged), with nothing written."""
    pushed, unchanged, uploaded, vanished = [], [], 0, []
    there = bool(store.known_marker())  # no store yet: the push would make it, and every bundle is new
    for e in chosen:
        data = bundle_of(layout, e)
        if data is None:
            vanished.append(str(e.id))
            continue
        sha = hashlib.sha256(data).hexdigest()
        current = store.record(layout.name, e.id) if there else None
        if current is not None and current.sha256 == sha and store.fs.exists(store.join(store.bundle_rel(layout.name, e.id, sha))):
            unchanged.append(str(e.id))
        else:
            pushed.append(str(e.id))
            uploaded += len(data)
    return PushResult(tuple(pushed), tuple(unchanged), uploaded, tuple(vanished))


def _unseal(out: Output, url: str, refs: tuple[str, ...], seal: bool) -> None:
    if refs or seal:
        raise UsageError("--unseal only unseals: give the store URL alone (then push as usual)")
    store = Store(url)
    changed = unseal(store)
    out.emit(human=lambda: out.line(f"{store} is writable again" if changed else f"{store} was not sealed"),
             data={"store": str(store), "unsealed": changed})
