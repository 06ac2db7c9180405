"""``import``: an archive's entries staged, checked and committed all or nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from autotune_cache.tree.store.archive import import_archive
from autotune_cache.errors import ExitCode, FiAutotuneError, UsageError

from ..transferring import dry_run_extras, dry_run_lines, planned_import
from ..output import Output
from ..params import archive_layout_option, cache_dir_option, json_option, new_tree_option
from ..roots import resolve_root


@click.command("import")
@click.argument("archive", metavar="ARCHIVE|-")
@cache_dir_option
@archive_layout_option
@click.option("--force", is_flag=True, help="Replace a different complete entry, or one tuned on another GPU model.")
@click.option("--dry-run", is_flag=True,
              help="Validate the archive and print the entries it would install; the tree is left as it was.")
@new_tree_option
@json_option
def import_cmd(archive, cache_dir, layout, force, dry_run, new_tree, as_json):
    """Validate an archive (from `export`, or `tar czf x.tgz -C ROOT flashinfer`) and install
    all of its entries or none: a refusal, a bad member, a full disk or a kill leaves the tree as
    it was (a kill mid-install is finished by the next fi-autotune command)."""
    out = Output(as_json)
    root = resolve_root(cache_dir, must_exist=False, layout=layout, writes=True, new_tree=new_tree)
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
    rows = None
    try:
        if dry_run:
            rows, result = planned_import(layout, root.path, stream, label, force)
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
        if dry_run:
            for entry_id in result.unchanged:
                out.note(f"unchanged {entry_id}: already there")
            if not result.refused:
                dry_run_lines(out, "import", rows, str(root.path))
            return
        for entry_id in result.imported:
            out.line(f"imported   {entry_id}")
        for entry_id in result.unchanged:
            out.line(f"unchanged  {entry_id}")

    # A dry run prints the run's own object (``dry_run`` true) and exits as the run would.
    out.emit(human=human, data={**result.to_dict(), "dry_run": dry_run, **dry_run_extras(rows, root.path)},
             ids=list(result.imported))
    for entry_id, why in result.refused:
        out.error(f"{entry_id}: {why}")
    if result.refused:
        out.error(f"nothing {'would be' if dry_run else 'was'} imported ({len(result.refused)} of the archive's "
                  "entries refused)")
        raise click.exceptions.Exit(int(ExitCode.FAILURE))
