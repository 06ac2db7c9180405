"""``export`` and ``import``: move entries between machines as reproducible .tar.gz bundles."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from autotune_cache.tree.store.archive import import_archive, import_archives
from autotune_cache.tree.store.export import export_entries, export_to_file
from autotune_cache.errors import ExitCode, FiAutotuneError, UsageError
from autotune_cache.humanize import format_size, plural
from autotune_cache.tree.scanner.scan import scan_cache
from autotune_cache.tree.status import EntryStatus

from .output import Output
from .params import archive_layout_option, cache_dir_option, entry_filter, filter_options, json_option, resolve_root


def exportable(out: Output, entries, include_incomplete: bool, verb: str = "pushing") -> list:
    """Complete entries; incomplete and unverified ones (no manifest to count their rank files)
    only when asked (warned); never corrupt or diverged (``push`` and ``export``)."""
    chosen = []
    for e in entries:
        if e.status == EntryStatus.COMPLETE:
            chosen.append(e)
        elif e.status == EntryStatus.UNVERIFIED and include_incomplete:
            out.warn(f"{verb} {e.id} unverified ({e.ranks_str} rank files, no manifest says how many it needs)")
            chosen.append(e)
        elif e.status == EntryStatus.UNVERIFIED:
            out.note(f"skipping {e.id}: unverified ({e.ranks_str} rank files, no manifest says how many it needs; "
                     "--include-incomplete takes it too)")
        elif e.status == EntryStatus.INCOMPLETE and include_incomplete:
            out.warn(f"{verb} {e.id} incomplete ({e.ranks_str} rank files): engines re-tune every rank of it")
            chosen.append(e)
        elif e.status == EntryStatus.INCOMPLETE:
            out.note(f"skipping {e.id}: incomplete ({e.ranks_str} rank files; --include-incomplete takes it too)")
        else:
            out.note(f"skipping {e.id}: {e.status} ({'; '.join(e.problems)})")
    return chosen


def planned_import(layout, root, stream, label: str, force: bool = False) -> tuple[list[tuple[str, int]], object]:
    """(id, bytes) of each entry an archive would install, and the import's result: read,
    validated, staged and decided (refusals included) exactly as ``import`` does, then
    discarded before the commit (the transaction removes its staging, and any directory it made)."""
    sizes: dict[str, int] = {}

    def measure(plans, txn) -> None:
        for plan in plans:
            for eid in plan.entries:
                if eid in txn.staged:
                    sizes[str(eid)] = sum(r.size for r in txn.staged[eid].records.values())

    result = import_archives(layout, root, [(stream, label)], force=force, check=measure, dry_run=True)
    return [(i, sizes.get(i, 0)) for i in result.imported], result


class FdWriter:
    """Bytes to a file descriptor, every one or an error: a pipe whose reader stops mid-archive
    takes part of a large write and Python's buffered stdout let the rest go with exit 0
    (seen: 65,536 of 766,517 bytes, "Exported 400 entries"); here the next write raises EPIPE."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        return len(data)


def dry_run_lines(out: Output, verb: str, rows: list[tuple[str, int]], where: str) -> None:
    """The human view of a dry run: each entry that would move, and the total."""
    past = {"push": "pushed to", "pull": "pulled from", "export": "exported to", "import": "imported into"}[verb]
    for entry_id, size in rows:
        out.line(f"would {verb:<7}{entry_id}  {format_size(size)}")
    out.line(f"{plural(len(rows), 'entry', 'entries')} ({format_size(sum(n for _, n in rows))}) would be "
             f"{past} {where}; nothing was changed (--dry-run)")


def dry_run_listing(out: Output, verb: str, rows: list[tuple[str, int]], where: str) -> None:
    """``--dry-run`` of push, pull, export and import: what would move, nothing changed."""
    out.emit(human=lambda: dry_run_lines(out, verb, rows, where), data={"dry_run": True, "where": where, "entries": [{"id": i, "size": n} for i, n in rows]},
             ids=[i for i, _ in rows])


@click.command("export")
@click.argument("refs", nargs=-1, metavar="[ID]...")
@click.option("-o", "--output", "output", required=True, help="Archive to write (.tar.gz), or - for stdout.")
@cache_dir_option
@archive_layout_option
@filter_options
@click.option("--include-incomplete", is_flag=True,
              help="Also export incomplete entries (an engine re-tunes every rank of one: it is warned about), and "
                   "unverified ones (no manifest counts their rank files).")
@click.option("--dry-run", is_flag=True, help="Print which entries would be exported; write nothing.")
@json_option
def export_cmd(refs, output, cache_dir, layout, model, versions, arch, status, older_than, unused_for, include_incomplete,
               dry_run, as_json):
    """Pack complete entries (all, or the named ones, or those the filters select) into a
    reproducible .tar.gz: the same entries always give the same bytes (Docker layer caching)."""
    to_stdout = output == "-"
    out = Output(as_json, results_to_stderr=to_stdout)  # stdout carries the archive itself
    root = resolve_root(cache_dir, must_exist=True, layout=layout)
    if to_stdout and sys.stdout.isatty() and not dry_run:
        raise UsageError("refusing to write a binary archive to a terminal: redirect stdout or give -o FILE")
    out_path = None if to_stdout else Path(output)
    if out_path is not None and not out_path.parent.is_dir():
        raise UsageError(f"output directory {str(out_path.parent)!r} does not exist")
    info = scan_cache(root.path, layout)
    entries = info.resolve(refs) if refs else list(info.entries)
    flt = entry_filter(model, versions, arch, status, older_than, unused_for)
    now = time.time()
    entries = [e for e in entries if flt.reasons(e, now) is not None]
    chosen = exportable(out, entries, include_incomplete, verb="exporting")
    if not chosen:
        raise FiAutotuneError("nothing to export")
    if dry_run:
        return dry_run_listing(out, "export", [(str(e.id), e.size_on_disk) for e in chosen],
                               "stdout" if to_stdout else str(out_path))
    if to_stdout:
        try:
            sys.stdout.flush()
            result = export_entries(layout, chosen, FdWriter(sys.stdout.fileno()))
        except BrokenPipeError:  # click would turn it into a silent exit 1
            raise FiAutotuneError("the reader of stdout stopped before the end: the archive it got is cut short") from None
    else:
        try:
            result = export_to_file(layout, chosen, out_path)
        except OSError as e:
            raise FiAutotuneError(f"cannot write {out_path}: {e.strerror or e}") from None
    for entry_id in result.vanished:
        out.note(f"skipped {entry_id}: deleted or replaced while exporting")
    for entry_id in result.empty:
        out.note(f"skipped {entry_id}: it holds no rank file (nothing to export)")
    where = "stdout" if to_stdout else str(out_path)
    summary = f"Exported {len(result.entries)} {'entry' if len(result.entries) == 1 else 'entries'} " \
              f"({len(result.members)} files, {result.size} bytes) to {where}"
    out.emit(human=lambda: out.line(summary), data={"archive": where, **result.to_dict()})


@click.command("import")
@click.argument("archive", metavar="ARCHIVE|-")
@cache_dir_option
@archive_layout_option
@click.option("--force", is_flag=True, help="Replace a different complete entry, or one tuned on another GPU model.")
@click.option("--dry-run", is_flag=True,
              help="Validate the archive and print the entries it would install; the tree is left as it was.")
@json_option
def import_cmd(archive, cache_dir, layout, force, dry_run, as_json):
    """Validate an archive (from `export`, or `tar czf x.tgz -C ROOT flashinfer`) and install
    all of its entries or none: a refusal, a bad member, a full disk or a kill leaves the tree as
    it was (a kill mid-install is finished by the next fi-autotune command)."""
    out = Output(as_json)
    root = resolve_root(cache_dir, must_exist=False, layout=layout)
    if archive == "-":
        stream, label = sys.stdin.buffer, "stdin"
    else:
        p = Path(archive)
        if not p.is_file():
            raise UsageError(f"archive {archive!r} does not exist or is not a file")
        try:
            stream = open(p, "rb")
        except OSError as e:
            raise FiAutotuneError(f"cannot read {archive}: {e.strerror or e}") from None
        label = archive
    try:
        if dry_run:
            rows, result = planned_import(layout, root.path, stream, label, force)
            if not result.refused:
                return dry_run_listing(out, "import", rows, str(root.path))
        else:
            result = import_archive(layout, root.path, stream, label, force=force)
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    for member, why in result.skipped:
        out.note(f"skipped {member}: {why}")
    for entry_id, what in result.incomplete:
        out.warn(f"{entry_id} is incomplete ({what}): engines re-tune every rank of it")

    def human() -> None:
        for entry_id in result.imported:
            out.line(f"imported   {entry_id}")
        for entry_id in result.unchanged:
            out.line(f"unchanged  {entry_id}")

    if not dry_run:
        out.emit(human=human, data=result.to_dict(), ids=list(result.imported))
    for entry_id, why in result.refused:
        out.error(f"{entry_id}: {why}")
    if result.refused:
        out.error(f"nothing {'would be' if dry_run else 'was'} imported ({len(result.refused)} of the archive's "
                  "entries refused)")
        raise click.exceptions.Exit(int(ExitCode.FAILURE))
