"""``push`` and ``pull``: entries to and from a remote store (s3://, gs://, file://, https://)."""

from __future__ import annotations

import io
import time

import click

from autotune_cache.tree.archive import import_archives
from autotune_cache.errors import ExitCode, FiAutotuneError, UsageError
from autotune_cache.autotuner.fingerprint import Fingerprint
from autotune_cache.tree.layout import DEFAULT_LAYOUT_NAME
from autotune_cache.tree.scan import scan_cache
from autotune_cache.tree.status import EntryStatus
from autotune_cache.tree.store import Store, bundle_of, is_store_url

from .output import Output
from .params import archive_layout_option, cache_dir_option, entry_filter, env_from_option, filter_options, json_option, resolve_root
from .serving import build_plan, request_from, serving_options
from .tree import recover_journals_quietly


def exportable(out: Output, entries, include_incomplete: bool, verb: str = "pushing") -> list:
    """Complete entries; incomplete ones only when asked (warned); never corrupt or diverged
    (``push`` and ``export``)."""
    chosen = []
    for e in entries:
        if e.status == EntryStatus.COMPLETE:
            chosen.append(e)
        elif e.status == EntryStatus.INCOMPLETE and include_incomplete:
            out.warn(f"{verb} {e.id} incomplete ({e.ranks_str} rank files): engines re-tune every rank of it")
            chosen.append(e)
        elif e.status == EntryStatus.INCOMPLETE:
            out.note(f"skipping {e.id}: incomplete ({e.ranks_str} rank files; --include-incomplete takes it too)")
        else:
            out.note(f"skipping {e.id}: {e.status} ({'; '.join(e.problems)})")
    return chosen


@click.command("push")
@click.argument("args", nargs=-1, required=True, metavar="[ID]... URL")
@cache_dir_option
@archive_layout_option
@filter_options
@click.option("--include-incomplete", is_flag=True, help="Also push incomplete entries (warned).")
@click.option("--read-only", "seal", is_flag=True,
              help="Seal the store after this push: it is marked read-only and later pushes are refused.")
@json_option
def push_cmd(args, cache_dir, layout, model, versions, arch, status, older_than, unused_for, include_incomplete, seal, as_json):
    """Publish complete entries (all, the named ones, or those the filters select) to a store.

    Each entry becomes one reproducible bundle named by its sha256, uploaded before its index
    record is published: readers never see a partial bundle, and a push killed midway leaves
    nothing visible (run it again). Credentials come from the backend's own configuration
    (AWS_* variables, profiles, workload identity; AWS_ENDPOINT_URL for S3-compatible servers).
    """
    out = Output(as_json)
    urls = [a for a in args if is_store_url(a)]
    if len(urls) != 1:
        raise UsageError("give exactly one store URL (s3://, gs://, file://) besides the entry ids")
    url, refs = urls[0], tuple(a for a in args if a != urls[0])
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
    result = store.push(layout, [(e, bundle_of(layout, e)) for e in chosen], seal=seal)

    def human() -> None:
        for entry_id in result.pushed:
            out.line(f"pushed     {entry_id}")
        for entry_id in result.unchanged:
            out.line(f"unchanged  {entry_id}")
        out.line(f"{len(result.pushed)} pushed, {len(result.unchanged)} already there, "
                 f"{result.uploaded_bytes} bytes uploaded to {store}" + ("; store sealed read-only" if seal else ""))

    out.emit(human=human, data={"store": str(store), **result.to_dict(), "sealed": seal}, ids=list(result.pushed))


def _local_gpu_name() -> str | None:
    """This machine's GPU model (NVML or nvidia-smi; no CUDA context, no torch), if any."""
    from autotune_cache.tune.gpus import detect_gpus

    info = detect_gpus()
    return info.names[0] if info.count else None


@click.command("pull")
@click.argument("url")
@click.argument("refs", nargs=-1, metavar="[ID]...")
@serving_options
@archive_layout_option
@env_from_option
@click.option("--force", is_flag=True, help="Replace a different complete entry, or one tuned on another GPU model.")
@click.option("--any-env", is_flag=True, help="Pull bundles tuned on another GPU model or software stack too.")
@json_option
def pull_cmd(url, refs, layout, env_from, force, any_env, as_json, **kw):
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
    if kw["model"] or kw["model_path"]:
        if layout.name != DEFAULT_LAYOUT_NAME:
            raise UsageError(f"serving flags name sglang entries only ({layout.name}'s key comes from the engine "
                             "itself): pull by id")
        if refs:
            raise UsageError("name entries by ID or by serving flags, not both")
        request = request_from(kw).for_target(fingerprint)
        plan = build_plan(request, str(root.path))
        if not plan.autotunes:
            out.note("the server would not autotune with these flags: nothing to pull")
            out.emit(human=lambda: None, data={"store": str(store), "imported": [], "unchanged": []})
            return
        wanted = [plan.entry_id]
    elif refs:
        wanted = []
        listing = None
        for ref in refs:
            eid = layout.parse_id(ref)
            if eid is None:
                listing = listing if listing is not None else store.records(layout.name)
                matches = [r.id for r in listing if r.id.name == ref]
                if len(matches) > 1:
                    raise UsageError(f"{ref!r} names {len(matches)} entries in {store}; give one id: "
                                     + ", ".join(map(str, matches)))
                if not matches:
                    raise FiAutotuneError(f"no entry {ref!r} in {store}")
                eid = matches[0]
            wanted.append(eid)
    else:
        wanted = None
    records = store.records(layout.name) if wanted is None else []
    if wanted is not None:
        for eid in wanted:
            rec = store.record(layout.name, eid)
            if rec is None:
                raise FiAutotuneError(f"no entry {eid} in {store}")
            records.append(rec)
    if not records:
        raise FiAutotuneError(f"nothing to pull: {store} holds no entries")

    target_gpu = fingerprint.gpu if fingerprint is not None else _local_gpu_name()
    refused = []
    for rec in records:
        if fingerprint is not None:
            verdict = fingerprint.compare(rec.metadata)
            if verdict.stale:
                refused.append((rec, f"tuned for another environment ({verdict.describe()})"))
        elif target_gpu and rec.gpu and rec.gpu != target_gpu:
            refused.append((rec, f"tuned on {rec.gpu}, this machine has {target_gpu}"))
    if refused and not any_env:
        for rec, why in refused:
            out.error(f"{rec.id}: {why}")
        raise FiAutotuneError(f"nothing was pulled: {len(refused)} bundle(s) are for another GPU or environment "
                              "(--any-env pulls them anyway)")
    if fingerprint is None and target_gpu is None and not any_env:
        out.note("no --env-from and no GPU here: the bundles' environment was not checked "
                 "(`fi-autotune check --env-from env.json` can do it later)")
    sources = [(io.BytesIO(store.fetch(rec)), f"{store} {rec.id}") for rec in records]
    result = import_archives(layout, root.path, sources, force=force)

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
