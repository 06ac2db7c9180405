"""Dealing work items to a pool of workers and reading their events until all are done.

Items go out one at a time (the next to whichever worker finishes first), in *phases* (careful
mode tunes, then races: a phase starts once every worker has saved the last one's results).
Any failure or signal stops every worker and raises; nothing is committed here.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from autotune_cache.errors import FiAutotuneError, Interrupted
from autotune_cache.humanize import how_it_ended
from autotune_cache.tune.workers.pool import WorkerPool, kill

#: ``on_done(event)`` may return callbacks to run once every worker has saved what it holds.
OnDone = Callable[[dict], "list[Callable[[], None]]"]


@dataclass
class Phase:
    """One round of work items dealt to the pool; the next phase starts once every item of this
    one is done and every worker has saved (``flush``): racing needs all tunes' results."""

    name: str  # tuning | racing
    items: Callable[[], list[str]]  # built when the phase starts
    total: int = 0  # progress units (tuning: profiles; racing: races)
    already: int = 0


class _Dealer:
    """The dealing state of one supervised run: pending items, busy workers and flush rounds.

    A *flush round* asks every worker still open to save what it holds and runs its callbacks
    once all have answered (``fleet`` commits a target as soon as its last item is done).
    Workers answer ``flush`` in order, so each ``flushed`` belongs to the oldest round still
    waiting on that worker."""

    def __init__(self, workers, phases: list[Phase], progress, pool: WorkerPool, on_done: OnDone | None):
        self.phases, self.progress, self.pool, self.on_done = phases, progress, pool, on_done
        self.live = [w for w, _ in workers]
        self.events: list[dict] = []
        self.current: dict[int, tuple] = {}
        self.phase, self.barrier = 0, -1
        self.done, self.total = phases[0].already, phases[0].total
        self.busy: set[int] = set()
        self.closed: set[int] = set()
        self.rounds: list[dict] = []  # {"waiting": set of workers, "then": [callbacks]}
        self.pending = list(reversed(phases[0].items()))  # pop() deals from the front

    def last_phase(self) -> bool:
        return self.phase == len(self.phases) - 1

    def deal(self, w: int) -> None:
        if self.pending:
            self.pool.send(w, self.pending.pop())
            self.busy.add(w)
        elif self.last_phase() and not self.rounds and w not in self.closed:
            self.pool.send(w, None)
            self.closed.add(w)

    def flush_then(self, callbacks: list[Callable[[], None]]) -> None:
        waiting = {w for w in self.live if w not in self.closed}
        for w in waiting:
            self.pool.send(w, "flush")
        self.rounds.append({"waiting": waiting, "then": list(callbacks)})
        self.settle()

    def settle(self) -> None:
        while self.rounds and not self.rounds[0]["waiting"]:
            for cb in self.rounds.pop(0)["then"]:
                cb()

    def next_phase(self) -> None:
        self.phase += 1
        phase = self.phases[self.phase]
        self.pending.extend(reversed(phase.items()))
        self.done, self.total = phase.already, phase.total or len(self.pending)
        if self.progress:
            self.progress(self.done, self.total, f"{phase.name} {len(self.pending)} items", phase.name)
        for w in self.live:
            self.deal(w)
        self.advance()

    def advance(self) -> None:
        # Between phases every worker saves what it holds first: the next phase's items are
        # built from the files (racing needs every tune's results).
        if self.pending or self.busy:
            return
        if not self.last_phase():
            if self.barrier != self.phase:
                self.barrier = self.phase
                self.flush_then([self.next_phase])
            return
        if not self.rounds:
            for w in self.live:
                self.deal(w)

    def start(self) -> None:
        if self.progress:
            self.progress(self.done, self.total, "starting workers", self.phases[0].name)
        for w in self.live:
            self.deal(w)
        self.advance()

    def on_event(self, ev: dict, w: int) -> str | None:
        """Take one worker event; a failure message if it reports one."""
        ev["worker"] = w
        self.events.append(ev)
        if ev["event"] == "start":
            self.current[w] = (ev["op"], ev["bucket"])
        elif ev["event"] in ("done", "raced"):
            self._finished_item(ev, w)
        elif ev["event"] == "flushed":
            for r in self.rounds:
                if w in r["waiting"]:
                    r["waiting"].discard(w)
                    break
            self.settle()
            self.advance()
        elif ev["event"] == "error":
            op, bucket = ev.get("op"), ev.get("bucket")
            where = (f" while tuning {op} at {bucket} tokens" if bucket is not None else f" while loading {op}") if op else ""
            return f"worker on GPU {w} failed{where}: {ev['message']}"
        return None

    def _finished_item(self, ev: dict, w: int) -> None:
        self.busy.discard(w)
        self.done += ev.get("profiles", 1)
        if self.progress:
            what = (f"{ev['op']} @ {ev['bucket']} tokens" if ev["event"] == "done"
                    else Path(ev["spec"]).stem.replace("race.", ""))
            self.progress(self.done, self.total, f"{what} (GPU {w})", self.phases[self.phase].name)
        callbacks = self.on_done(ev) if self.on_done and ev["event"] == "done" else []
        if callbacks:
            self.flush_then(callbacks)
        self.deal(w)
        self.advance()


def _read_events(sel: selectors.BaseSelector, dealer: _Dealer, workers, stop: dict) -> str | None:
    """Read the workers' event lines until every stream closes, a failure, or a signal.

    Raw reads split into lines here: a buffered readline() could keep a second event in its
    buffer while select() waits on an fd with nothing left to read (and the worker waits on us)."""
    buffers = {w: b"" for w, _ in workers}
    failure: str | None = None
    open_streams = len(workers)
    while open_streams and failure is None and stop["sig"] is None:
        for key, _ in sel.select(timeout=0.5):
            w, proc = key.data
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:
                sel.unregister(key.fd)
                open_streams -= 1
                if w not in dealer.closed and failure is None:
                    failure = exit_failure(dealer.pool, w, proc, dealer.current)
                continue
            *lines, buffers[w] = (buffers[w] + chunk).split(b"\n")
            for line in lines:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                failure = dealer.on_event(ev, w) or failure
    return failure


def supervise(workers, phases: list[Phase], progress, pool: WorkerPool, on_done: OnDone | None = None) -> list[dict]:
    """Deal each phase's items to ``workers`` (``[(index, process)]``) and read their events; on
    any failure or signal stop them all and raise. The events, for ``worker_timings``."""
    sel = selectors.DefaultSelector()
    for w, proc in workers:
        sel.register(proc.stdout.fileno(), selectors.EVENT_READ, (w, proc))
    dealer = _Dealer(workers, phases, progress, pool, on_done)
    stop: dict = {"sig": None}

    def _on_signal(signum, frame):  # noqa: ARG001
        stop["sig"] = signum

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    failure = None
    try:
        dealer.start()
        failure = _read_events(sel, dealer, workers, stop)
        for w, proc in workers:
            if failure is not None or stop["sig"] is not None:
                kill(proc)
            rc = proc.wait()
            if rc != 0 and failure is None and stop["sig"] is None:
                failure = exit_failure(pool, w, proc, dealer.current)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        sel.close()
    if stop["sig"] is not None:
        raise Interrupted("interrupted: nothing was written; finished buckets are kept and a rerun resumes from them")
    if failure:
        raise FiAutotuneError(failure + "; nothing was written")
    return dealer.events


def exit_failure(pool: WorkerPool, w: int, proc: subprocess.Popen, current: dict) -> str:
    """Why worker ``w`` stopped before it was told to: how it ended (``killed by SIGKILL``, ``exit
    status 1``) and its last log line."""
    try:
        how = how_it_ended(proc.wait(timeout=10))
    except subprocess.TimeoutExpired:
        how = "no exit status: its output closed"
    err = [ln for ln in pool.log_text(w).splitlines() if ln.strip()]
    op, bucket = current.get(w, (None, None))
    where = f" while tuning {op} at {bucket} tokens" if op else ""
    return f"worker on GPU {w} stopped ({how}){where}: {err[-1] if err else 'no message'}"
