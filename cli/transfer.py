"""``export`` and ``import``: move entries between machines as .tar.gz."""

from __future__ import annotations

from pathlib import Path

import click

from autotune_cache.archive import export_entries, import_archive
from autotune_cache.errors import FiAutotuneError, UsageError
from autotune_cache.scan import EntryStatus, scan_cache

from .main import cache_dir_option, cli, json_option, resolve_root
from .output import Output


@cli.command("export")
@click.argument("refs", nargs=-1, metavar="[KEY|PATH]...")
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False), help="Archive to write (.tar.gz).")
@cache_dir_option
@json_option
def export_cmd(refs, output, cache_dir, as_json):
    """Pack entries (all complete and incomplete ones by default) into a .tar.gz."""
    root = resolve_root(cache_dir)
    info = scan_cache(root)
    out = Output(as_json)
    if refs:
        entries = []
        for ref in refs:
            found = info.find(ref)
            if not found:
                raise FiAutotuneError(f"no cache entry {ref!r} under {root}")
            entries.extend(e for e in found if e not in entries)
    else:
        entries = list(info.entries)
    exportable = [e for e in entries if e.status in (EntryStatus.COMPLETE, EntryStatus.INCOMPLETE)]
    for e in entries:
        if e not in exportable:
            out.note(f"skipping {e.id}: {e.status} ({'; '.join(e.problems)})")
    if not exportable:
        raise FiAutotuneError("nothing to export")
    out_path = Path(output)
    if out_path.parent and not out_path.parent.is_dir():
        raise UsageError(f"output directory {str(out_path.parent)!r} does not exist")
    members = export_entries(root, exportable, out_path)
    if as_json:
        out.json({"archive": str(out_path), "entries": [e.id for e in exportable], "members": members})
    else:
        out.line(f"Exported {len(exportable)} entries ({len(members)} files) to {out_path}")


@cli.command("import")
@click.argument("archive", type=click.Path(dir_okay=False))
@cache_dir_option
@click.option("--force", is_flag=True, help="Replace a different complete entry.")
@json_option
def import_cmd(archive, cache_dir, force, as_json):
    """Validate an archive made by `export` and write its entries atomically."""
    root = resolve_root(cache_dir)
    if not Path(archive).is_file():
        raise UsageError(f"archive {archive!r} does not exist or is not a file")
    result = import_archive(root, Path(archive), force=force)
    out = Output(as_json)
    if as_json:
        out.json(result.to_dict())
    else:
        for entry_id in result.imported:
            out.line(f"imported   {entry_id}")
        for entry_id in result.unchanged:
            out.line(f"unchanged  {entry_id}")
    for entry_id, why in result.refused:
        click.echo(f"fi-autotune: error: {entry_id}: {why}", err=True)
    if result.refused:
        raise click.exceptions.Exit(1)
