"""One output layer for every command, in the manner of huggingface_hub's CLI output helper.

A command builds its result once and hands it over with ``emit``: a function that prints the
human view, the object ``--json`` prints, and the ids ``-q`` prints. The mode decides which
one runs; commands never branch on ``--json``/``-q`` themselves. Notes and warnings go to
stderr so stdout stays machine-readable in every mode.
"""

from __future__ import annotations

import enum
import json
import os
import shutil
import sys
from operator import itemgetter
from typing import Any, Callable, Iterable, Sequence

import click

PROG = "fi-autotune"


class Mode(enum.Enum):
    HUMAN = "human"
    JSON = "json"
    QUIET = "quiet"


#: The version of each command's ``--json`` envelope. Every object a command prints starts with
#: ``"format": "fi-autotune.<command>/<version>"``; the version goes up when a field changes
#: meaning or goes away (fields are only ever added within a version). The schemas are
#: docs/schemas/<command>.schema.json; tests/cli/test_json_schemas.py holds every output to them.
JSON_FORMATS = {
    "plan": 1, "warm": 1, "verify": 1, "check": 1, "ls": 1, "show": 1, "prune": 1, "rm": 1, "export": 1,
    "import": 1, "push": 1, "pull": 1, "convert": 1, "diff": 1, "env": 1, "key": 1, "doctor": 1,
    "workers": 1,
}


def json_format(command: str) -> str:
    return f"{PROG}.{command}/{JSON_FORMATS[command]}"


def envelope(command: str, data: Any) -> dict:
    """``data`` as ``command``'s envelope: ``format`` first; a list (``show``, ``convert``) goes
    under ``entries``, so every command prints one object."""
    fmt = json_format(command)
    if isinstance(data, list):
        data = {"entries": data}
    if data.get("format", fmt) != fmt:
        raise AssertionError(f"{command}'s JSON carries format {data['format']!r}, not {fmt!r}")
    return {"format": fmt, **{k: v for k, v in data.items() if k != "format"}}


class Output:
    def __init__(self, as_json: bool = False, quiet: bool = False, results_to_stderr: bool = False,
                 command: str | None = None):
        """``results_to_stderr``: stdout carries data of its own (``export -o -``). ``command``:
        whose envelope ``--json`` prints (default: the click command running)."""
        self.mode = Mode.JSON if as_json else Mode.QUIET if quiet else Mode.HUMAN
        self.err = results_to_stderr
        ctx = click.get_current_context(silent=True)
        self.command = command or (ctx.command.name if ctx is not None else None)

    # the one call a command makes for its result -------------------------------------------
    def emit(
        self,
        *,
        human: Callable[[], None] | None = None,
        data: Any | Callable[[], Any] = None,
        ids: Sequence[str] | None = None,
    ) -> None:
        if self.mode is Mode.JSON:
            obj = envelope(self.command, data() if callable(data) else data)
            click.echo(json.dumps(obj, indent=2, default=str), err=self.err)
        elif self.mode is Mode.QUIET:
            for i in ids or ():
                click.echo(i, err=self.err)
        else:
            self.human(human)

    def emit_stream(
        self,
        *,
        human: Callable[[], None],
        head: dict,
        items_key: str,
        items: Iterable[dict],
        tail: Callable[[], dict],
        id_key: str = "id",
    ) -> None:
        """``emit`` for results too many to hold (``ls`` of 100,000 entries): ``--json`` writes
        the very object ``emit`` would (``head``'s fields, the items under ``items_key``, then
        ``tail()``'s fields, computed once the items are out), item by item; ``-q`` writes each
        item's id as it comes; the human view holds what it needs (a table needs its rows)."""
        if self.mode is Mode.HUMAN:
            human()
            return
        write = (sys.stderr if self.err else sys.stdout).write
        if self.mode is Mode.QUIET:
            for item in items:
                write(f"{item[id_key]}\n")
            return
        head = {"format": json_format(self.command), **head}
        fields = [f"  {json.dumps(k)}: {_nested(v, 2)}" for k, v in head.items()]
        write("{\n" + "".join(f + ",\n" for f in fields) + f"  {json.dumps(items_key)}: [")
        count = 0
        for item in items:
            write(("\n" if not count else ",\n") + "    " + _nested(item, 4))
            count += 1
        write("\n  ]" if count else "]")
        write("".join(f",\n  {json.dumps(k)}: {_nested(v, 2)}" for k, v in tail().items()) + "\n}\n")

    def human(self, view: Callable[[], None] | None) -> None:
        """Run a human view now (a plan shown before asking to confirm); nothing in other modes."""
        if self.mode is Mode.HUMAN and view is not None:
            view()

    # building blocks of a human view --------------------------------------------------------
    def line(self, text: str = "") -> None:
        if self.mode is Mode.HUMAN:
            click.echo(text, err=self.err)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[str]], fit: Sequence[str] = ()) -> None:
        """Aligned columns. ``fit``: the columns that may go, in order, while the table is wider
        than the terminal (``COLUMNS``, else the tty's width; piped output keeps every column)."""
        if self.mode is not Mode.HUMAN:
            return
        widths = [max(len(h), max(map(len, map(itemgetter(i), rows)), default=0)) for i, h in enumerate(headers)]
        keep = list(range(len(headers)))
        limit = terminal_width(self.err)
        for name in fit:
            if limit is None or sum(widths[i] for i in keep) + 2 * (len(keep) - 1) <= limit:
                break
            keep.remove(list(headers).index(name))
        dropped = len(keep) < len(headers)
        if dropped:
            headers, widths = [headers[i] for i in keep], [widths[i] for i in keep]
        fmt = "  ".join("{:<%d}" % w for w in widths)
        stream = sys.stderr if self.err else sys.stdout
        lines = [fmt.format(*headers).rstrip(), fmt.format(*("-" * w for w in widths)).rstrip()]
        for start in range(0, len(rows), TABLE_CHUNK):  # 100,000 rows: not one string of them all
            part = rows[start:start + TABLE_CHUNK]
            if dropped:
                part = [[row[i] for i in keep] for row in part]
            lines.extend(fmt.format(*row).rstrip() for row in part)
            stream.write("\n".join(lines) + "\n")
            lines = []
        if lines:
            stream.write("\n".join(lines) + "\n")

    # stderr -----------------------------------------------------------------------------------
    def note(self, text: str) -> None:
        """Progress and side remarks; silent under ``-q``."""
        if self.mode is not Mode.QUIET:
            click.echo(text, err=True)

    def warn(self, text: str) -> None:
        click.echo(f"{PROG}: warning: {text}", err=True)

    def error(self, text: str) -> None:
        """A failure that does not stop the command (the command exits non-zero at the end)."""
        click.echo(f"{PROG}: error: {text}", err=True)


def _nested(value: Any, indent: int) -> str:
    """``value`` as ``json.dumps(indent=2)`` writes it nested ``indent`` spaces deep."""
    return json.dumps(value, indent=2, default=str).replace("\n", "\n" + " " * indent)


#: Rows of a table formatted per write.
TABLE_CHUNK = 4096


def terminal_width(to_stderr: bool = False) -> int | None:
    """The width a table must fit: ``$COLUMNS`` if set, else the terminal's; None when the output
    is not a terminal (a pipe or a file gets every column, for scripts)."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    stream = sys.stderr if to_stderr else sys.stdout
    if not stream.isatty():
        return None
    return shutil.get_terminal_size().columns
