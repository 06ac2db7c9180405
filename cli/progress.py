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


class TransferProgress:
    """Bytes moved by ``push`` and ``pull``: one bar on stderr where stderr is a terminal and the
    output is for people (as hf, docker and uv do); nothing in a pipe, a log, or with ``--json``."""

    def __init__(self, enabled: bool, total: int, verb: str):
        self.bar = None
        if enabled and total > 0 and sys.stderr.isatty():
            try:
                from tqdm import tqdm  # huggingface_hub's dependency, as warm's bar
            except ImportError:  # no bar, the transfer all the same
                return
            self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=verb, file=sys.stderr,
                            leave=False, dynamic_ncols=True)

    def advance(self, n: int, what: str = "") -> None:
        if self.bar is not None:
            if what:
                self.bar.set_postfix_str(what[-40:], refresh=False)
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.refresh()  # the last count drawn once (updates in between are throttled), then cleared
            self.bar.close()
            self.bar = None

    def counting(self, pairs):
        """``(entry, bundle)`` pairs, each counted once the consumer asks for the next one (its
        upload is done by then); closed after the last."""
        try:
            for entry, data in pairs:
                yield entry, data
                self.advance(len(data or b""), str(entry.id))
        finally:
            self.close()

    def fetching(self, store) -> None:
        """Count every bundle ``store`` fetches from now on."""
        fetch = store.fetch

        def counted(rec):
            data = fetch(rec)
            self.advance(len(data), str(rec.id))
            return data

        store.fetch = counted
