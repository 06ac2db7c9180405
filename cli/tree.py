"""``ls``, ``show`` and ``prune``: the cache tree as a user sees it."""

from __future__ import annotations

import functools
import sys
import time

import click

from autotune_cache.envcheck import installed_flashinfer_version
from autotune_cache.errors import FiAutotuneError, UsageError
from autotune_cache.humanize import format_size, parse_duration
from autotune_cache.scan import CacheEntry, CacheInfo, EntryStatus, map_entries, scan_cache

from .main import cache_dir_option, cli, json_option, quiet_option, resolve_root
from .output import Output

SORTS = {
    "key": lambda e: (e["key"], e["id"]),
    "model": lambda e: (e["model"] or "~", e["id"]),
    "size": lambda e: -e["size_on_disk"],
    "modified": lambda e: -e["last_modified"],
    "status": lambda e: (e["status"], e["id"]),
    "path": lambda e: e["id"],
}


def _statuses(values: tuple[str, ...]) -> tuple[str, ...]:
    out = tuple(s.strip() for v in values for s in v.split(",") if s.strip())
    unknown = [s for s in out if s not in EntryStatus.ALL]
    if unknown:
        raise UsageError(f"unknown status {unknown[0]!r}; known: {', '.join(EntryStatus.ALL)}")
    return out


def _scan(root, check_env: bool) -> CacheInfo:
    """Whole-tree scan in this process (show, prune): they need the entries themselves."""
    checker = None
    if check_env:
        from autotune_cache.envcheck import metadata_checker

        checker = metadata_checker()
    return scan_cache(root, check_env=checker)


def _filter(entries, model, versions, arch, statuses, older_than_s):
    now = time.time()
    out = []
    for e in entries:
        if model and (e["model"] is None or model not in e["model"]):
            continue
        if versions and e["flashinfer_version"] not in versions:
            continue
        if arch and e["arch"] not in arch:
            continue
        if statuses and e["status"] not in statuses:
            continue
        if older_than_s is not None and now - e["last_modified"] < older_than_s:
            continue
        out.append(e)
    return out


def _summary(e: CacheEntry, full: bool = False) -> dict:
    """What ls needs of an entry: computed where the entry was scanned (maybe a child process),
    so only this small dict crosses the pipe."""
    if full:
        d = e.to_dict()
    else:
        d = {
            "id": e.id, "key": e.key, "model": e.model, "flashinfer_version": e.flashinfer_version,
            "arch": e.arch, "status": e.status, "size_on_disk": e.size_on_disk,
            "last_modified": e.last_modified, "rank_files": len(e.rank_files),
        }
    d["row"] = [
        e.key, e.model or "-", e.flashinfer_version, e.arch, e.parallel_str, e.ranks_str,
        str(e.num_configs), e.size_on_disk_str, e.last_modified_str, e.status,
    ]
    d["notes"] = [f"{e.id}: {p}" for p in e.problems] + [
        f"{e.id}: {f.kind}: {f.path.name}: {f.message}" for f in e.foreign
    ]
    return d


HEADERS = ["KEY", "MODEL", "FLASHINFER", "ARCH", "PARALLEL", "RANKS", "CONFIGS", "SIZE", "MODIFIED", "STATUS"]


@cli.command("ls")
@cache_dir_option
@click.option("--model", help="Only entries whose model path contains this string.")
@click.option("--flashinfer-version", "versions", multiple=True, help="Only this FlashInfer version (repeatable).")
@click.option("--arch", multiple=True, help="Only this arch, e.g. sm90 (repeatable).")
@click.option("--status", "status", multiple=True, help="Only these statuses (comma-separated or repeated).")
@click.option("--older-than", help="Only entries not modified for this long (30d, 12h, 90m).")
@click.option("--sort", type=click.Choice(sorted(SORTS)), default="path", show_default=True)
@click.option("--check-env", is_flag=True, help="Mark entries FlashInfer on this machine would ignore as stale (imports flashinfer).")
@json_option
@quiet_option
def ls_cmd(cache_dir, model, versions, arch, status, older_than, sort, check_env, as_json, quiet):
    """List cache entries (one per key dir) with their status."""
    root = resolve_root(cache_dir)
    statuses = _statuses(status)
    older_than_s = parse_duration(older_than) if older_than else None
    checker = None
    if check_env or EntryStatus.STALE in statuses:
        from autotune_cache.envcheck import metadata_checker

        checker = metadata_checker()
    summaries, findings = map_entries(root, functools.partial(_summary, full=as_json), check_env=checker)
    entries = sorted(_filter(summaries, model, versions, arch, statuses, older_than_s), key=SORTS[sort])
    out = Output(as_json, quiet)
    if quiet:
        out.keys([e["key"] for e in entries])
        return
    counts = {s: sum(1 for e in entries if e["status"] == s) for s in EntryStatus.ALL}
    totals = {
        "entries": len(entries),
        "rank_files": sum(e["rank_files"] if isinstance(e["rank_files"], int) else len(e["rank_files"]) for e in entries),
        "size_on_disk": sum(e["size_on_disk"] for e in entries),
        "by_status": {s: n for s, n in counts.items() if n},
    }
    if as_json:
        for e in entries:
            del e["row"], e["notes"]
        out.json({
            "root": str(root),
            "entries": entries,
            "findings": [f.to_dict() for f in findings] + [f for e in entries for f in e["foreign"]],
            "totals": totals,
        })
        return
    if entries:
        out.table(HEADERS, [e["row"] for e in entries])
    by_status = ", ".join(f"{n} {s}" for s, n in totals["by_status"].items()) or "nothing cached"
    out.line(
        f"\n{len(entries)} entries, {totals['rank_files']} rank files, "
        f"{format_size(totals['size_on_disk'])} in {root} ({by_status})"
    )
    for e in entries:
        for note in e["notes"]:
            out.note(note)
    for f in findings:
        out.note(f"{f.kind}: {f.path}: {f.message}")


def _one_entry(info: CacheInfo, ref: str) -> list[CacheEntry]:
    matches = info.find(ref)
    if not matches:
        raise FiAutotuneError(f"no cache entry {ref!r} under {info.root}")
    return matches


@cli.command("show")
@click.argument("ref", metavar="KEY|PATH")
@cache_dir_option
@click.option("--check-env", is_flag=True, help="Compare the metadata with this machine's FlashInfer (imports flashinfer).")
@json_option
def show_cmd(ref, cache_dir, check_env, as_json):
    """Show one entry: manifest, rank files, tuned ops and their bucket counts, metadata."""
    from autotune_cache.rankfile import summarize_ops

    root = resolve_root(cache_dir)
    info = _scan(root, check_env)
    out = Output(as_json)
    docs = []
    for e in _one_entry(info, ref):
        ops = []
        for rf in e.rank_files:
            if rf.ok:
                try:
                    ops = summarize_ops(rf.load())
                    break
                except (OSError, ValueError):
                    continue
        docs.append((e, ops))
    if as_json:
        out.json([
            {**e.to_dict(),
             "manifest": e.manifest.to_dict() if e.manifest else None,
             "metadata": e.metadata,
             "ops": [{"custom_op": o.custom_op, "configs": o.configs, "buckets": o.buckets, "runners": list(o.runners)} for o in ops]}
            for e, ops in docs
        ])
        return
    for i, (e, ops) in enumerate(docs):
        if i:
            out.line()
        out.line(f"Entry     {e.id}")
        out.line(f"Path      {e.path}")
        out.line(f"Status    {e.status}" + (f" ({'; '.join(e.problems)})" if e.problems else ""))
        m = e.manifest
        if m:
            out.line(f"Model     {m.model}")
            out.line(f"Schema    {m.schema}")
            out.line(f"Key str   {m.key_string}")
            for k, v in m.key_fields.to_dict().items():
                out.line(f"  {k:<20}{v}")
            t = m.topology
            out.line(f"Topology  tp={t.tp} pp={t.pp} dp={t.dp} ({'dp-attention' if t.dp_attention else 'replicas'})")
            out.line(f"Tool      fi-autotune {m.tool_version}, created {m.created}, updated {m.updated}")
            if m.stats:
                out.line("Stats     " + ", ".join(f"{k}={v}" for k, v in m.stats.items()))
        else:
            out.line("Manifest  none (written by an engine, not by fi-autotune)")
        out.line(f"Size      {e.size_on_disk_str}, modified {e.last_modified_str}")
        out.line("Rank files")
        expected = set(e.expected_files)
        present = {rf.name for rf in e.rank_files}
        rows = [[rf.name, rf.size_on_disk_str, str(rf.num_configs), (rf.sha256 or "-")[:12], rf.error or "ok"] for rf in e.rank_files]
        rows += [[name, "-", "-", "-", "missing"] for name in sorted(expected - present)]
        out.table(["FILE", "SIZE", "CONFIGS", "SHA256", "STATE"], rows)
        out.line("Tuned ops")
        if ops:
            out.table(["CUSTOM_OP", "CONFIGS", "BUCKETS", "RUNNERS"], [[o.custom_op, str(o.configs), str(o.buckets), ",".join(o.runners)] for o in ops])
        else:
            out.line("  (none readable)")
        out.line("FlashInfer metadata")
        for k, v in sorted(e.metadata.items()):
            out.line(f"  {k:<24}{v}")
        for f in e.foreign:
            out.line(f"Foreign   {f.path.name}: {f.kind}: {f.message}")


@cli.command("prune")
@cache_dir_option
@click.option("--older-than", help="Entries not modified for this long (30d, 12h).")
@click.option("--flashinfer-version", "versions", multiple=True, help="Entries of this FlashInfer version (repeatable).")
@click.option("--other-versions", is_flag=True, help="Entries of every FlashInfer version but the installed one.")
@click.option("--status", "status", multiple=True, help="Entries with these statuses (comma-separated or repeated).")
@click.option("--keep-latest", type=int, help="Per model, keep the N most recently modified entries.")
@click.option("--dry-run", is_flag=True, help="Print the plan and delete nothing.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@quiet_option
def prune_cmd(cache_dir, older_than, versions, other_versions, status, keep_latest, dry_run, yes, as_json, quiet):
    """Delete entries matching every given criterion, plus stale temp files."""
    from autotune_cache.prune import plan_prune

    root = resolve_root(cache_dir)
    statuses = _statuses(status)
    other = None
    if other_versions:
        other = installed_flashinfer_version()
        if other is None:
            raise UsageError("--other-versions needs flashinfer-python installed to know the current version")
    older_than_s = parse_duration(older_than) if older_than else None
    check_env = None
    if EntryStatus.STALE in statuses:
        from autotune_cache.envcheck import metadata_checker

        check_env = metadata_checker()
    info = scan_cache(root, check_env=check_env)
    plan = plan_prune(
        info, older_than_s=older_than_s, flashinfer_versions=tuple(versions), other_versions_than=other,
        statuses=statuses, keep_latest=keep_latest, check_env=check_env,
    )
    out = Output(as_json, quiet)
    if quiet:
        out.keys([c.entry.key for c in plan.candidates])
    elif not as_json:
        if plan.empty:
            out.line("Nothing to prune.")
            return
        if plan.candidates:
            out.table(
                ["KEY", "MODEL", "FLASHINFER", "ARCH", "SIZE", "STATUS", "WHY"],
                [[c.entry.key, c.entry.model or "-", c.entry.flashinfer_version, c.entry.arch,
                  c.entry.size_on_disk_str, c.entry.status, "; ".join(c.reasons)] for c in plan.candidates],
            )
        if plan.stale_temp:
            out.line(f"{len(plan.stale_temp)} stale temp file(s) or staging dir(s)")
        verb = "Would free" if dry_run else "Will free"
        out.line(f"{verb} {plan.expected_freed_size_str} ({len(plan.candidates)} entries).")
    if dry_run:
        if as_json:
            out.json({"dry_run": True, "plan": plan.to_dict()})
        return
    if plan.empty:
        if as_json:
            out.json({"dry_run": False, "plan": plan.to_dict(), "result": None})
        return
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError("refusing to delete without confirmation on a non-interactive input; pass -y")
        if not click.confirm("Delete these?", default=False, err=True):
            raise click.exceptions.Abort()
    result = plan.execute()
    if as_json:
        out.json({"dry_run": False, "plan": plan.to_dict(), "result": result.to_dict()})
    else:
        out.line(f"Deleted {len(result.deleted)} entries, {result.temp_removed} temp files; freed {format_size(result.freed)}.")
        for entry_id, why in result.skipped:
            out.note(f"skipped {entry_id}: {why}")
    for path, err in result.errors:
        click.echo(f"fi-autotune: error: cannot delete {path}: {err}", err=True)
    if result.errors:
        raise click.exceptions.Exit(1)
