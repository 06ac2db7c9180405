"""What moving entries shares (export, import, push, pull): which entries may leave, a staged import, an fd writer, dry-run lines."""

from __future__ import annotations

import os


from autotune_cache.tree.store.archive import import_archives
from autotune_cache.humanize import format_size, plural
from autotune_cache.tree.status import EntryStatus

from .output import Output


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


def dry_run_lines(out: Output, verb: str, rows: list[tuple[str, int]], where: str, upload: int | None = None) -> None:
    """The human view of a dry run: each entry that would move, and the total; ``upload``: the
    bytes the run would send (a push sends compressed bundles, a fraction of the size on disk),
    so that the human total says what the run then reports, as ``--json``'s ``uploaded_bytes``."""
    past = {"push": "pushed to", "pull": "pulled from", "export": "exported to", "import": "imported into"}[verb]
    for entry_id, size in rows:
        out.line(f"would {verb:<7}{entry_id}  {format_size(size)}")
    size = format_size(sum(n for _, n in rows))
    total = size if upload is None else f"{size} on disk, {upload} bytes to upload"
    out.line(f"{plural(len(rows), 'entry', 'entries')} ({total}) would be {past} {where}; nothing was changed (--dry-run)")


def dry_run_extras(rows: list[tuple[str, int]] | None, where, keeps_entries: bool = True) -> dict:
    """What a dry run's JSON adds to the run's own object: ``where`` and ``sizes`` (each entry that
    would move, with its bytes); ``import`` and ``push`` also keep format /1's dry-run ``entries``
    (the same listing) for its readers - ``export``'s ``entries`` is the run's list of ids. A real
    run adds nothing (``rows`` None)."""
    if rows is None:
        return {}
    listing = [{"id": i, "size": n} for i, n in rows]
    return {"where": str(where), "sizes": listing, **({} if keeps_entries is False else {"entries": listing})}


class NullWriter:
    """A sink that counts: ``export --dry-run`` writes the very archive, to nowhere."""

    def __init__(self) -> None:
        self.size = 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        return len(data)
