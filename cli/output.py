"""One output layer for every command: a human table, ``--json``, or ``-q`` (keys only)."""

from __future__ import annotations

import json
import sys
from typing import Any, Sequence

import click


class Output:
    def __init__(self, as_json: bool = False, quiet: bool = False):
        self.as_json = as_json
        self.quiet = quiet

    @property
    def human(self) -> bool:
        return not (self.as_json or self.quiet)

    def json(self, obj: Any) -> None:
        click.echo(json.dumps(obj, indent=2, default=str))

    def line(self, text: str = "") -> None:
        if self.human:
            click.echo(text)

    def note(self, text: str) -> None:
        """Progress and side remarks: stderr, so stdout stays machine-readable."""
        if not self.quiet:
            click.echo(text, err=True)

    def keys(self, keys: Sequence[str]) -> None:
        for k in keys:
            click.echo(k)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        widths = [len(h) for h in headers]
        for row in rows:
            for i, cell in enumerate(row):
                widths[i] = max(widths[i], len(cell))
        fmt = "  ".join("{:<%d}" % w for w in widths)
        lines = [fmt.format(*headers).rstrip(), fmt.format(*("-" * w for w in widths)).rstrip()]
        lines.extend(fmt.format(*row).rstrip() for row in rows)
        sys.stdout.write("\n".join(lines) + "\n")
