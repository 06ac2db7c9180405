"""What ``prune`` and ``rm`` share: their options, a store to delete from, and running a delete plan (show it, confirm, delete, report)."""

from __future__ import annotations

import sys

import click

from autotune_cache.errors import ExitCode, UsageError
from autotune_cache.tree.delete import DeletePlan, describe_result
from autotune_cache.tree.store.store import Store

from .output import PROG, Output


dry_run_option = click.option("--dry-run", is_flag=True, help="Print the plan and delete nothing.")


yes_option = click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")


def run_delete(plan: DeletePlan, out: Output, dry_run: bool, yes: bool, named: bool = False,
               recovered: list[str] | tuple = ()) -> None:
    """Print the plan; unless --dry-run, confirm and execute it; print what happened. ``named``
    (``rm``): the user asked for exactly these entries, so one left in place is a failure.
    ``recovered``: what the command finished of killed writers' transactions before it planned
    (noted, and under --json in ``recovered``, whether or not anything is deleted then)."""
    for note in recovered:
        out.note(note)
    for note in getattr(plan, "notes", ()):  # in every mode: what the plan went by instead
        out.note(note)

    def human_plan() -> None:
        if plan.candidates:
            out.table(
                ["ID", "MODEL", "GPU", "SIZE", "STATUS", "WHY"],
                [[str(c.entry.id), c.entry.model or "-", c.entry.gpu_short, c.entry.size_on_disk_str,
                  c.entry.status.value, "; ".join(c.reasons)] for c in plan.candidates],
            )
        if plan.leftovers:
            out.line(f"{len(plan.leftovers)} leftover(s) of interrupted writes (staging, trash or temp files)")
        for e in getattr(plan, "locked_temps", ()):
            out.line(f"temp files of an interrupted write in {e.id} (removed under its lock)")
        for entry_id, why in plan.left_alone:
            out.note(f"left {entry_id}: {why}")
        for entry_id in getattr(plan, "already_deleted", ()):
            out.note(f"{entry_id}: already deleted (by an interrupted rm or prune; what it left goes now)")
        budget = getattr(plan, "budget", None)
        if budget is not None and budget.message:  # a budget not met, or met only by what the engine reads
            out.line(budget.message)
        if plan.empty:
            if budget is None or budget.met:
                out.line("Nothing to delete.")
        else:
            verb = "Would free" if dry_run else "Will free"
            n = len(plan.candidates)
            out.line(f"{verb} {plan.expected_freed_size_str} ({n} {'entry' if n == 1 else 'entries'}).")

    if not plan.empty:  # a dry run refuses what the run would: a sealed store, a tree this user cannot write
        plan.check_writable()
    if dry_run or plan.empty:
        out.emit(human=human_plan, data={"dry_run": dry_run, "plan": plan.to_dict(), "result": None,
                                         "recovered": list(recovered)},
                 ids=[str(c.entry.id) for c in plan.candidates])
        if named and plan.left_alone and not dry_run:
            raise click.exceptions.Exit(int(ExitCode.FAILURE))
        return
    out.human(human_plan)
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError("refusing to delete without confirmation on a non-interactive input; pass -y")
        if not click.confirm("Delete these?", default=False, err=True):
            # Declining is an answer, not an interruption (Ctrl-C at the prompt exits 130).
            click.echo(f"{PROG}: aborted: nothing was changed", err=True)
            raise click.exceptions.Exit(int(ExitCode.FAILURE))
    result = plan.execute()

    def human_result() -> None:
        out.line(describe_result(result))
        for entry_id, why in result.skipped:
            out.note(f"left {entry_id}: {why}")

    out.emit(human=human_result, data={"dry_run": False, "plan": plan.to_dict(), "result": result.to_dict(),
                                       "recovered": list(recovered)},
             ids=[e for e, _ in result.deleted])
    for path, err in result.errors:
        out.error(f"{path}: {err}")
    if result.errors or (named and result.skipped):
        raise click.exceptions.Exit(int(ExitCode.FAILURE))


def store_at(url: str) -> Store:
    """A store to delete from (``rm URL``, ``prune URL``): one that exists."""
    store = Store(url)
    store.require()
    return store
