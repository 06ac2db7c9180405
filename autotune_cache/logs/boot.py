"""What each server and rank did at boot, assembled from a log's events.

One *session* is one autotune pass on one rank, as the engine's dialect marks it (its
``pass.*`` events: an engine's autotune context opens one per worker, a speculative draft
worker and an extra pass each their own, each with its own cache path). FlashInfer's lines and
tqdm bars carry no rank; they go to the session open on the only rank of their stream, else to
the server (``shared_bars``), since TP ranks tune in step and print a bar each. What differs
between engines (how a rank reads its file, whether passes end with the log, whether ranks tune
in step) each engine's dialect says; nothing here names an engine.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from autotune_cache.logs.dialect import LogDialect
from autotune_cache.logs.formats import dialect_of, dialects
from autotune_cache.logs.library import LIBRARY
from autotune_cache.logs.reader import Event


@dataclass
class Session:
    rank: str
    path: str | None  # the cache file, or the managed store's directory
    engine: str
    managed: bool = False  # FlashInfer's v2 store
    reuse_disabled: bool = False
    dropped: bool = False  # the engine dropped the rank files: ranks disagreed
    started: str | None = None
    ended: str | None = None
    complete: bool = False
    bars: list[dict] = field(default_factory=list)  # this rank's own bars
    cut_bars: list[str] = field(default_factory=list)  # ops of this rank's bars cut short or garbled
    saw_shared_bars: bool = False  # bars of unknown rank were printed while this was open
    ran_dummy_pass: bool = False  # the engine said it runs the tuning pass (``pass.dummy``: no cache hit)
    saved_new: bool = False  # FlashInfer saved configs it had just tuned to this pass's file ("N new")
    hits: list[str] = field(default_factory=list)
    loaded: int | None = None
    other_env: str | None = None
    preloaded: tuple[int, int] | None = None
    round: int = 0  # the n-th session of this rank

    @property
    def tuned(self) -> bool:
        return (bool(self.bars) or bool(self.cut_bars) or self.saw_shared_bars or self.ran_dummy_pass
                or self.saved_new)


@dataclass
class Server:
    name: str
    engine: str | None = None
    version: str | None = None
    ranks: dict[str, list[Session]] = field(default_factory=dict)
    shared_bars: list[dict] = field(default_factory=list)
    shared_cut: list[str] = field(default_factory=list)  # ops of rank-less bars cut short or garbled
    server_args: dict | None = None
    dropped_rounds: set[tuple[str, int]] = field(default_factory=set)  # (TP group, round)
    lines: int = 0

    def open_sessions(self) -> list[Session]:
        return [s[-1] for s in self.ranks.values() if s and not s[-1].complete]

    def sessions(self) -> list[Session]:
        return [s for sessions in self.ranks.values() for s in sessions]


def _parse_args(text: str) -> dict | None:
    """A logged ``repr`` of a dict of arguments (``server.args``: literals only, or values that
    are objects' reprs, ``KernelConfig(...)``): each key whose value is a literal is kept, the
    others are left out."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        value = None
    if isinstance(value, dict):
        return value
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, MemoryError, RecursionError, ValueError):
        return None
    if not isinstance(tree, ast.Dict):
        return None
    out = {}
    for k, v in zip(tree.keys, tree.values):
        try:
            out[ast.literal_eval(k)] = ast.literal_eval(v)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
    return out


def _open(server: Server, ev: Event, path: str | None, **kw) -> Session:
    sessions = server.ranks.setdefault(ev.rank or "-", [])
    s = Session(ev.rank or "-", path, ev.engine, started=ev.ts, round=len(sessions), **kw)
    sessions.append(s)
    return s


def _session_for_path(server: Server, path: str, known: tuple[LogDialect, ...]) -> Session | None:
    """A FlashInfer line names the file it read: the session of that file (where each rank reads
    a file named after it, such lines are attributed exactly; the leader may have named its own
    file only, the others' differ in the name)."""
    for s in reversed(server.sessions()):
        if s.path == path:
            return s
    for d in known:
        found = d.rank_of_file(server, path)
        if found is None:
            continue
        label, first = found
        for s in reversed(server.sessions()):
            if s.engine == d.name and (s.path is None or PurePosixPath(s.path).parent == PurePosixPath(path).parent):
                if s.rank == label or (first and len(server.ranks) == 1):
                    return s
    return None


def _current(server: Server) -> Session | None:
    """The session a rank-less line belongs to: the one open, when only one is."""
    open_ = server.open_sessions()
    if len(open_) == 1:
        return open_[0]
    if not open_ and len(server.ranks) == 1:
        sessions = next(iter(server.ranks.values()))
        return sessions[-1] if sessions else None
    return None


def _bar(server: Server, ev: Event) -> None:
    """A bar (``tuner.bar``), or one cut short or garbled (``tuner.bar_cut``: its op only)."""
    cut = ev.kind == "tuner.bar_cut"
    s = _current(server)
    if s is not None and (len(server.ranks) == 1 or len(server.open_sessions()) == 1):
        s.cut_bars.append(ev.fields["op"]) if cut else s.bars.append(ev.fields)
        return
    server.shared_cut.append(ev.fields["op"]) if cut else server.shared_bars.append(ev.fields)
    for o in server.open_sessions():
        o.saw_shared_bars = True


def _tuner_alone(server: Server, ev: Event) -> bool:
    """A log of FlashInfer with no engine line (a script of the user's, our ``verify``): its own
    lines mark the passes. ``Loaded N configs from PATH`` opens one (the file it read), so does
    ``Autotuning process starts`` where none is open; ``... ends`` closes it. True if handled."""
    if server.engine not in (None, LIBRARY.name) or any(s.engine != LIBRARY.name for s in server.sessions()):
        return False
    if ev.kind in ("tuner.loaded", "tuner.start"):
        server.engine = LIBRARY.name
    open_ = server.open_sessions()
    if ev.kind == "tuner.loaded":
        s = open_[-1] if open_ and open_[-1].path is None and not open_[-1].started else _open(server, ev, ev.fields["path"])
        s.path, s.loaded = ev.fields["path"], int(ev.fields["n"])
        return True
    if ev.kind == "tuner.start":
        s = open_[-1] if open_ else _open(server, ev, None)
        s.started = s.started or ev.ts
        return True
    if ev.kind == "tuner.end" and open_:
        open_[-1].complete, open_[-1].ended = True, ev.ts
        return True
    return False


def _tuner_line(server: Server, ev: Event, known: tuple[LogDialect, ...]) -> None:
    f, kind = ev.fields, ev.kind
    if _tuner_alone(server, ev):
        return
    target = _session_for_path(server, f["path"], known) if "path" in f else _current(server)
    if target is None and "path" in f:
        # a rank that read a file named after it, before (or without) a line of its own
        for d in known:
            if (found := d.rank_of_file(server, f["path"])) is not None:
                rank = found[0]
                target = Session(rank, f["path"], d.name, round=len(server.ranks.get(rank, [])))
                server.ranks.setdefault(rank, []).append(target)
                break
    if kind == "tuner.attached":
        if target is not None and target.managed:
            target.path = f["env_dir"]
    if target is None:
        return
    if kind == "tuner.hit":
        target.hits.append(f["op"])
    elif kind == "tuner.loaded":
        target.loaded = int(f["n"])
    elif kind == "tuner.other_env":
        target.other_env = f["diff"]
    elif kind == "tuner.saved" and int(f["new"]) > 0:
        target.saved_new = True
    elif kind == "tuner.preloaded":
        target.preloaded = (int(f["n"]), int(f["total"]))


def _engine_line(server: Server, ev: Event, dialect: LogDialect) -> None:
    """An engine's own line, by what it means (``dialect.EVENTS``)."""
    kind, f = ev.kind, ev.fields
    if kind == "pass.open":
        _open(server, ev, f["path"])
    elif kind == "pass.open_fresh":
        _open(server, ev, f["path"], reuse_disabled=True)
    elif kind == "pass.open_managed":
        _open(server, ev, None, managed=True)
    elif kind == "ranks.disagree":
        rank = ev.rank or "-"
        server.dropped_rounds.add((dialect.rank_group(rank), len(server.ranks.get(rank, []))))
    elif kind == "pass.end":
        sessions = server.ranks.get(ev.rank or "-", [])
        if sessions and not sessions[-1].complete:
            sessions[-1].complete, sessions[-1].ended = True, ev.ts
    elif kind == "server.args":
        server.server_args = _parse_args(f["args"])
    elif kind == "server.version":
        server.version = server.version or f["version"]
    elif kind == "pass.dummy":
        s = server.ranks.get(ev.rank or "-")
        (s[-1] if s else _open(server, ev, None)).ran_dummy_pass = True


def assemble(servers: dict[str, Server], events: list[Event]) -> None:
    """Fold one log's events into ``servers`` (by server name)."""
    known = dialects()
    by_name = {d.name: d for d in known}
    for ev in events:
        server = servers.setdefault(ev.server, Server(ev.server))
        server.lines += 1
        if ev.engine != LIBRARY.name and server.engine in (None, LIBRARY.name) and ev.kind != "other":
            server.engine = ev.engine
        if ev.kind in ("tuner.bar", "tuner.bar_cut"):
            _bar(server, ev)
        elif ev.kind.startswith("tuner."):
            _tuner_line(server, ev, known)
        elif ev.kind != "other":
            _engine_line(server, ev, by_name.get(ev.engine, LIBRARY))
    for server in servers.values():
        _finish(server, by_name)


def _finish(server: Server, by_name: dict[str, LogDialect]) -> None:
    """Drops apply to every rank of the dropping group in that round; a pass ends with the log
    where the engine prints no end line, else only at its ``pass.end``."""
    for s in server.sessions():
        d = by_name.get(s.engine, LIBRARY)
        if (d.rank_group(s.rank), s.round) in server.dropped_rounds:
            s.dropped = True
        if d.passes_end_with_log:
            s.complete = True
    d = by_name.get(server.engine or "", LIBRARY)
    if d.leader_names_cache:
        _spread_lead(server)
    if d.ranks_in_lockstep and d.lockstep_ranks(server) > 1:
        _unattribute_bars(server)


def lockstep_ranks(server: Server) -> int:
    """How many of the server's ranks tune in step (1 where its engine's ranks do not)."""
    d = dialect_of(server.engine)
    return d.lockstep_ranks(server) if d is not None and d.ranks_in_lockstep else 1


def _unattribute_bars(server: Server) -> None:
    """A bar carries no rank and the server's ranks tune in step: bars read while one worker's
    session was the only one open (the others had not spoken yet) were any worker's. They are
    the server's, as where ranks print their own prefix, not one rank's (whose time would add up
    every rank's bar)."""
    for s in server.sessions():
        if s.bars or s.cut_bars:
            server.shared_bars.extend(s.bars)
            server.shared_cut.extend(s.cut_bars)
            s.bars, s.cut_bars = [], []
            s.saw_shared_bars = True
    if server.shared_bars or server.shared_cut:
        for s in server.sessions():
            s.saw_shared_bars = s.saw_shared_bars or s.ran_dummy_pass or s.saved_new


def _spread_lead(server: Server) -> None:
    """Only the leader names the cache; the other workers read the same entry."""
    lead = next((s for s in server.sessions() if s.path or s.managed), None)
    if lead is None:
        return
    for rank, sessions in server.ranks.items():
        if not sessions:
            sessions.append(Session(rank, lead.path, server.engine, managed=lead.managed, complete=True))
        for s in sessions:
            if s.path is None and not s.managed:
                s.path = lead.path
            s.managed = s.managed or lead.managed
