"""Progress of a warm on stderr: the library reports ``(done, total, what, phase)``, this prints it."""

from __future__ import annotations

import sys

import click


class Progress:
    """One overall bar on a TTY; a line per 10% otherwise."""

    UNITS = {"tuning": "profile", "racing": "race", "pairing": "race"}

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.bar = None
        self.phase = None
        self.last_decile = -1

    def __call__(self, done: int, total: int, what: str, phase: str = "tuning") -> None:
        if not self.enabled:
            return
        unit = self.UNITS.get(phase, "item")
        if phase != self.phase:  # careful mode races after tuning: a bar (or decile count) each
            self.close()
            self.phase, self.last_decile = phase, -1
        if self.tty:
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=done, unit=unit, desc=phase, file=sys.stderr)
            self.bar.n = done
            self.bar.set_postfix_str(what[:40], refresh=True)
            return
        decile = 10 * done // max(total, 1)
        if decile != self.last_decile:
            self.last_decile = decile
            click.echo(f"fi-autotune: {phase} {done}/{total} {unit}s ({what})", err=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
