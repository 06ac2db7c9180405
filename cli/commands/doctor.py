"""``doctor LOG...``: what the server's own startup log says it loaded, tuned, and why."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from autotune_cache.errors import ExitCode, UsageError
from autotune_cache.logs.diagnose import DoctorReport, diagnose
from autotune_cache.safeopen import FileRefused, FileTooLarge, open_bounded

from ..output import Output
from ..textfit import fit_columns, short_entry, wrap_command, wrap_text
from ..params import json_option

#: A log larger than this is refused rather than read into memory (a day of a busy server's
#: request log is far smaller; startup lines come first anyway): a file by its size before its
#: first byte is read, stdin once this much came through.
MAX_LOG_BYTES = 1 << 30


def _read(name: str) -> tuple[str, str]:
    """One log's text. A path must be a regular file (a FIFO or a device is refused before its
    first byte: ``doctor -`` reads a stream); either is read to at most ``MAX_LOG_BYTES``."""
    try:
        if name == "-":
            data = sys.stdin.buffer.read(MAX_LOG_BYTES + 1)
            if len(data) > MAX_LOG_BYTES:
                raise FileTooLarge("-", name, "too large")
        else:
            with open_bounded(name, MAX_LOG_BYTES, what="log") as f:
                data = f.read()
    except FileTooLarge:
        raise UsageError(f"{name} is over 1 GiB: give the startup part (head -c 1G)") from None
    except FileRefused as e:
        raise UsageError(f"{name} is a {e.kind}, not a log file: pipe a stream into `doctor -`") from None
    except IsADirectoryError:
        raise UsageError(f"{name} is a directory, not a log file") from None
    except FileNotFoundError:
        raise UsageError(f"{name}: no such log file") from None
    except OSError as e:
        raise UsageError(f"cannot read {name}: {e.strerror or e}") from None
    return ("-" if name == "-" else name), data.decode("utf-8", errors="replace")


#: The human view's width: the table, the causes and the fixes fit it (the details: ``-v``, ``--json``).
WIDTH = 100


def _tuned_cell(s: dict, verbose: bool) -> str:
    ops = _per_op(s["tuned"])
    unreadable = [f"{op} (bars cut or garbled)" for op in s["tuned_unreadable"]]
    if verbose:
        tuned = ", ".join([*ops, *unreadable])
    elif s["tuned"] or unreadable:
        n = len({o["op"] for o in s["tuned"]} | set(s["tuned_unreadable"]))
        tuned = (f"{n} op{'s' if n > 1 else ''}, {sum(o['seconds'] or 0 for o in s['tuned']):g} s"
                 if len(", ".join(ops)) > 30 or unreadable else ", ".join(ops))
    else:
        tuned = ""
    if not tuned and s["tuned_elsewhere"]:
        tuned = "yes (bars carry no rank)" if verbose else "yes (see below)"
    return tuned or "-"


def _rows(server: dict, verbose: bool) -> list[list[str]]:
    rows = []
    for rank in server["ranks"]:
        for s in rank["sessions"]:
            present = s["in_tree"]
            ours = "-" if present is None else (present["status"] if present["present"] else "absent")
            where = s["entry"] or s["cache_path"] or "-"
            took = f"{s['duration_seconds']} s" if s["duration_seconds"] is not None else "-"
            if verbose:
                rows.append([rank["rank"], s["cache"], where + (f" (in tree: {ours})" if present else ""),
                             _tuned_cell(s, True), took])
            else:
                rows.append([rank["rank"], s["cache"], short_entry(where), ours, _tuned_cell(s, False), took])
    if verbose:
        return rows
    merged: list[list[str]] = []  # ranks whose every other column is the same: one row
    count = []
    for row in rows:
        if merged and merged[-1][1:] == row[1:]:
            count[-1] += 1
            continue
        merged.append(row)
        count.append(1)
    return [[f"{r[0]} (+{n - 1})" if n > 1 else r[0], *r[1:]] for r, n in zip(merged, count)]


def _human(out: Output, report: DoctorReport, verbose: bool = False) -> None:
    for server in report.servers:
        head = f"{server['server']}: {server['engine'] or 'engine unknown'}"
        head += f" {server['version']}" if server["version"] else ""
        verdict = (f"tuned at startup, about {server['tuning_seconds']} s" if server["tuned"]
                   else "nothing tuned at startup")
        out.line(f"{head} - {verdict}")
        if verbose:
            out.table(["rank", "cache", "entry", "tuned", "pass took"], _rows(server, True), fit=["pass took", "tuned"])
        else:
            headers = ["rank", "cache", "entry", "ours", "tuned", "took"]
            out.table(headers, fit_columns(_rows(server, False), headers, WIDTH))
        for o in server["shared_tuning"]:
            out.line(f"  tuned: {o['op']} {o['done']}/{o['profiles']} profiles in {o['seconds']} s "
                     f"({o['bars']} bar{'s' if o['bars'] > 1 else ''}; a bar names no rank)")
        if server["shared_unreadable"]:
            out.line(f"  tuned: {', '.join(server['shared_unreadable'])} (bars cut or garbled: how far, unknown; "
                     "a bar names no rank)")
        for c in server["causes"]:
            lines = wrap_text(c["cause"], f"  cause ({c['ranks']} pass{'es' if c['ranks'] > 1 else ''}): ", "    ")
            fix = c.get("fix")
            if fix:
                lines += wrap_text(f"fix{' (' + fix['where'] + ')' if fix['where'] else ''}:", "  ", "    ")
                lines += wrap_command(fix["command"], "      ")
            for line in lines:
                out.line(line)
        out.line()


@click.command("doctor")
@click.argument("logs", nargs=-1, required=True, metavar="LOG...")
@click.option("--cache-dir", "cache_dirs", multiple=True, type=click.Path(file_okay=False),
              help="A tree to find the logged cache paths in (repeatable: an SGLang root, a vLLM root, a "
                   "FlashInfer store root); default: each engine's own root here.")
@click.option("--store", metavar="URL", default=None,
              help="The store the servers' trees are pulled from: a missing entry's fix is then "
                   "`fi-autotune pull URL ID` (the store is not contacted).")
@click.option("-v", "--verbose", is_flag=True, help="The table in full: whole entry ids, each op tuned, one row a rank.")
@json_option
def doctor_cmd(logs, cache_dirs, store, verbose, as_json):
    """Read SGLang / vLLM / FlashInfer startup logs: per server and rank, the cache read, what was
    tuned at boot, how long, and why.

    LOG is a file or - for stdin: one rank's log, or a `kubectl logs` / `docker logs` dump with
    every rank interleaved. The formats read are those of SGLang 0.5.23, vLLM 0.33.0 and
    FlashInfer 0.7.2.post1 (others are warned about). Each logged cache path is looked up as an
    entry of our trees (--cache-dir): a pass that tuned gets one cause - no entry at that key
    (and the field that differs from the nearest entry), another environment, ranks that
    disagreed, an op or bucket our plan does not cover, or cache reuse switched off.

    Exit status: 0 nothing was tuned at startup, 1 something was (the causes printed), 2 a
    usage error (a log that cannot be read).
    """
    out = Output(as_json)
    texts = [_read(name) for name in logs]
    report = diagnose(texts, [Path(d) for d in cache_dirs], store)
    if not report.servers and all(w.endswith("no line of SGLang, vLLM or FlashInfer in it") for w in report.warnings):
        raise UsageError("no log given holds a line of SGLang, vLLM or FlashInfer: is it a server's startup log?")
    for w in report.warnings:
        out.warn(w)
    out.emit(human=lambda: _human(out, report, verbose), data=report.to_dict())
    if report.tuned:
        raise click.exceptions.Exit(int(ExitCode.FAILURE))


def _per_op(tuned: list[dict]) -> list[str]:
    """One item per op: a pass that tuned an op twice (two bars: two shapes, or two ranks in one
    process) says so once, with the profiles and seconds added up."""
    ops: dict[str, list[dict]] = {}
    for o in tuned:
        ops.setdefault(o["op"], []).append(o)
    out = []
    for op, bars in ops.items():
        done, total = sum(b["done"] for b in bars), sum(b["profiles"] for b in bars)
        secs = sum(b["seconds"] or 0 for b in bars)
        out.append(f"{op} {done}/{total}" + (f" ({len(bars)} bars)" if len(bars) > 1 else "") + f" in {secs:g} s")
    return out
