"""``export``: entries written as one reproducible .tar.gz archive (or stdout)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from autotune_cache.tree.store.export import export_entries, export_to_file, open_stream, output_target
from autotune_cache.errors import FiAutotuneError, UsageError
from autotune_cache.tree.scanner.scan import scan_cache

from ..transferring import FdWriter, NullWriter, dry_run_extras, dry_run_lines, exportable
from ..output import Output
from ..filters import entry_filter, filter_options
from ..params import archive_layout_option, cache_dir_option, json_option
from ..roots import resolve_root


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
def export_cmd(refs, output, cache_dir, layout, model, model_glob, versions, arch, status, older_than, unused_for, include_incomplete,
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
    flt = entry_filter(model, versions, arch, status, older_than, unused_for, model_glob=model_glob)
    now = time.time()
    entries = [e for e in entries if flt.reasons(e, now) is not None]
    chosen = exportable(out, entries, include_incomplete, verb="exporting")
    if not chosen:
        raise FiAutotuneError("nothing to export")
    where = "stdout" if to_stdout else str(out_path)
    if dry_run:  # the very archive, written to nowhere: the run's object, exact to its size
        result = export_entries(layout, chosen, NullWriter())
    elif to_stdout:
        sys.stdout.flush()
        result = _stream(layout, chosen, sys.stdout.fileno(), "stdout")
    else:
        result = _to_path(layout, chosen, out_path)
    for entry_id in result.vanished:
        out.note(f"skipped {entry_id}: deleted or replaced while exporting")
    for entry_id in result.empty:
        out.note(f"skipped {entry_id}: it holds no rank file (nothing to export)")
    rows = [(str(e.id), e.size_on_disk) for e in chosen if str(e.id) in result.entries] if dry_run else None
    summary = f"Exported {len(result.entries)} {'entry' if len(result.entries) == 1 else 'entries'} " \
              f"({len(result.members)} files, {result.size} bytes) to {where}"
    out.emit(human=(lambda: dry_run_lines(out, "export", rows, where)) if dry_run else (lambda: out.line(summary)),
             data={"archive": where, **result.to_dict(), "dry_run": dry_run,
                   **dry_run_extras(rows, where, keeps_entries=False)}, ids=list(result.entries))


def _stream(layout, chosen, fd: int, reader: str):
    """The archive written through ``fd`` as it is made (stdout, a device, a FIFO); a reader that
    stops midway is one line and exit 1, a full device ``OSError``'s own line (``main``)."""
    try:
        return export_entries(layout, chosen, FdWriter(fd))
    except BrokenPipeError:  # click would turn it into a silent exit 1
        raise FiAutotuneError(f"the reader of {reader} stopped before the end: the archive it got is cut short") from None


def _to_path(layout, chosen, out_path: Path):
    """``-o PATH``: streamed into the device or FIFO at PATH exactly as into stdout (renaming a
    temp file over it would replace it), else written atomically at PATH, or at the target of
    the link PATH is (the link stays)."""
    try:
        target, stream = output_target(out_path)
        fd = open_stream(target) if stream else None
    except OSError as e:
        raise FiAutotuneError(f"cannot write {out_path}: {e.strerror or e}") from None
    if fd is None:
        try:
            return export_to_file(layout, chosen, target)
        except OSError as e:
            raise FiAutotuneError(f"cannot write {out_path}: {e.strerror or e}") from None
    try:
        if os.isatty(fd):
            raise UsageError(f"refusing to write a binary archive to a terminal ({out_path}): give -o FILE")
        return _stream(layout, chosen, fd, str(out_path))
    finally:
        os.close(fd)
