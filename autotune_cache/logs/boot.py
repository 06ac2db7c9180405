"""What each server and rank did at boot, assembled from a log's events.

One *session* is one autotune pass on one rank: SGLang's ``flashinfer_autotune_context`` (the
target worker, a speculative draft worker and the optional extend pass each open one, each with
its own cache path), or vLLM's ``flashinfer_autotune``. FlashInfer's lines and tqdm bars carry no
rank; they go to the session open on the only rank of their stream, else to the server
(``shared_bars``), since TP ranks tune in step and print a bar each.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from autotune_cache.logs.reader import Event


#: vLLM's per-rank file name (vllm/model_executor/warmup/flashinfer_autotune_cache.py:57-59).
_VLLM_RANK_FILE = re.compile(r"autotune_configs_dp(\d+)_rank(\d+)\.json$")


@dataclass
class Session:
    rank: str
    path: str | None  # the cache file (SGLang, vLLM per-rank) or managed store dir (vLLM single GPU)
    engine: str
    managed: bool = False  # FlashInfer's v2 store (vLLM, one GPU)
    reuse_disabled: bool = False
    dropped: bool = False  # SGLang deleted the rank files: ranks disagreed
    started: str | None = None
    ended: str | None = None
    complete: bool = False
    bars: list[dict] = field(default_factory=list)  # this rank's own bars
    cut_bars: list[str] = field(default_factory=list)  # ops of this rank's bars cut short or garbled
    saw_shared_bars: bool = False  # bars of unknown rank were printed while this was open
    ran_dummy_pass: bool = False  # vLLM: "Running FlashInfer autotune with N tokens" (no cache hit)
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


def tp_group(rank: str) -> str:
    """The TP group a rank is in: its prefix less the TP and EP tokens (``DP1 TP3`` -> ``DP1``);
    with dp-attention every rank shows a DP token yet all share one TP group, which is the
    conservative reading for a drop anyway (the whole group tunes again)."""
    return " ".join(t for t in rank.split() if not t.startswith(("TP", "EP", "DP")))


def _parse_args(text: str) -> dict | None:
    """A logged ``repr`` of a dict of arguments: SGLang's ``server_args=`` (literals only) or
    vLLM's ``non-default args:`` (whose values may be objects' reprs, ``KernelConfig(...)``):
    each key whose value is a literal is kept, the others are left out."""
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


def _session_for_path(server: Server, path: str) -> Session | None:
    """A FlashInfer line names the file it read: the session of that file (vLLM's per-rank files
    carry the rank in their names, so such lines are attributed exactly)."""
    for s in reversed(server.sessions()):
        if s.path == path:
            return s
    m = _VLLM_RANK_FILE.search(path)
    for s in reversed(server.sessions()):  # vLLM logs rank 0's path; the others' differ in the name only
        if m and s.engine == "vllm" and (s.path is None or PurePosixPath(s.path).parent == PurePosixPath(path).parent):
            if s.rank == vllm_rank_label(server, int(m[1]), int(m[2])) or (m[2] == "0" and len(server.ranks) == 1):
                return s
    return None


_WORKER_TOKEN = re.compile(r"_(DP|PP|PCP|TP|DCP|EP)(\d+)")


def _worker_tokens(label: str) -> dict[str, int]:
    """``Worker_DP1_TP3_EP3`` -> ``{"DP": 1, "TP": 3, "EP": 3}`` (vLLM's worker process names,
    multiproc_executor.py:1214-1227)."""
    return {k: int(v) for k, v in _WORKER_TOKEN.findall(label)} if label.startswith("Worker") else {}


def vllm_tp_size(server: Server) -> int | None:
    """The server's TP size: as its ``non-default args`` state it, else as its workers' names
    show it where they show PP stages too; None where it is not known (no pipeline stages
    shown: a world rank is then the TP rank)."""
    args = server.server_args or {}
    tp = args.get("tensor_parallel_size")
    if isinstance(tp, int) and not isinstance(tp, bool) and tp > 0:
        return tp
    tokens = [_worker_tokens(r) for r in server.ranks]
    if any("PP" in t for t in tokens):
        return 1 + max(t.get("TP", 0) for t in tokens)
    return None


def vllm_rank_label(server: Server, dp: int, rank: int) -> str:
    """The name vLLM gives the worker that reads ``autotune_configs_dp{dp}_rank{rank}.json``
    (its rank in the engine's world group: PP stage x TP size + TP rank), so a rank is one label
    whether its lines or only its file are seen: the worker's own name where it spoke, else the
    name vLLM gives it, shaped like its siblings' (``Worker_TP1``, ``Worker_TP1_EP1``)."""
    tp_size = vllm_tp_size(server)
    pp, tp = divmod(rank, tp_size) if tp_size else (0, rank)
    tp_size = tp_size or 1 + max(rank, *(_worker_tokens(r).get("TP", 0) for r in server.ranks))
    named = [r for r in server.ranks if _worker_tokens(r)]
    for r in named:
        t = _worker_tokens(r)
        if t.get("DP", dp) == dp and t.get("PP", 0) == pp and t.get("TP", 0) == tp:
            return r
    shape = _worker_tokens(named[0]) if named else {"TP": 0}
    parts = {"DP": dp, "PP": pp, "TP": tp, "EP": dp * tp_size + tp}
    label = "Worker" + "".join(f"_{k}{parts[k]}" for k in ("DP", "PP", "TP", "EP")
                               if k in shape or (k == "DP" and dp) or (k == "PP" and pp))
    return label if label != "Worker" else ("Worker_TP0" if not named and rank == 0 else f"Worker_{rank}")


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
    """A bar (``flashinfer.bar``), or one cut short or garbled (``flashinfer.bar_cut``: its op only)."""
    cut = ev.kind == "flashinfer.bar_cut"
    s = _current(server)
    if s is not None and (len(server.ranks) == 1 or len(server.open_sessions()) == 1):
        s.cut_bars.append(ev.fields["op"]) if cut else s.bars.append(ev.fields)
        return
    server.shared_cut.append(ev.fields["op"]) if cut else server.shared_bars.append(ev.fields)
    for o in server.open_sessions():
        o.saw_shared_bars = True


def _flashinfer_alone(server: Server, ev: Event) -> bool:
    """A log of FlashInfer with no engine line (a script of the user's, our ``verify``): its own
    lines mark the passes. ``Loaded N configs from PATH`` opens one (the file it read), so does
    ``Autotuning process starts`` where none is open; ``... ends`` closes it. True if handled."""
    if server.engine not in (None, "flashinfer") or any(s.engine != "flashinfer" for s in server.sessions()):
        return False
    if ev.kind in ("flashinfer.loaded", "flashinfer.start"):
        server.engine = "flashinfer"
    open_ = server.open_sessions()
    if ev.kind == "flashinfer.loaded":
        s = open_[-1] if open_ and open_[-1].path is None and not open_[-1].started else _open(server, ev, ev.fields["path"])
        s.path, s.loaded = ev.fields["path"], int(ev.fields["n"])
        return True
    if ev.kind == "flashinfer.start":
        s = open_[-1] if open_ else _open(server, ev, None)
        s.started = s.started or ev.ts
        return True
    if ev.kind == "flashinfer.end" and open_:
        open_[-1].complete, open_[-1].ended = True, ev.ts
        return True
    return False


def _flashinfer(server: Server, ev: Event) -> None:
    f, kind = ev.fields, ev.kind
    if _flashinfer_alone(server, ev):
        return
    target = _session_for_path(server, f["path"]) if "path" in f else _current(server)
    if target is None and "path" in f and (m := _VLLM_RANK_FILE.search(f["path"])):
        rank = vllm_rank_label(server, int(m[1]), int(m[2]))
        target = Session(rank, f["path"], "vllm", round=len(server.ranks.get(rank, [])))
        server.ranks.setdefault(rank, []).append(target)
    if kind == "flashinfer.attached":
        if target is not None and target.managed:
            target.path = f["env_dir"]
    if target is None:
        return
    if kind == "flashinfer.hit":
        target.hits.append(f["op"])
    elif kind == "flashinfer.loaded":
        target.loaded = int(f["n"])
    elif kind == "flashinfer.other_env":
        target.other_env = f["diff"]
    elif kind == "flashinfer.saved" and int(f["new"]) > 0:
        target.saved_new = True
    elif kind == "flashinfer.preloaded":
        target.preloaded = (int(f["n"]), int(f["total"]))


def _engine_line(server: Server, ev: Event) -> None:
    kind, f = ev.kind, ev.fields
    if kind == "sglang.cache":
        _open(server, ev, f["path"])
    elif kind == "sglang.reuse_disabled":
        _open(server, ev, f["path"], reuse_disabled=True)
    elif kind == "sglang.diverged":
        rank = ev.rank or "-"
        server.dropped_rounds.add((tp_group(rank), len(server.ranks.get(rank, []))))
    elif kind == "sglang.completed":
        sessions = server.ranks.get(ev.rank or "-", [])
        if sessions and not sessions[-1].complete:
            sessions[-1].complete, sessions[-1].ended = True, ev.ts
    elif kind == "sglang.server_args":
        server.server_args = _parse_args(f["args"])
    elif kind in ("vllm.version", "vllm.server_version", "vllm.logo_version"):
        server.version = server.version or f["version"]
    elif kind == "vllm.args":
        server.server_args = _parse_args(f["args"])
    elif kind == "vllm.cache_file":
        _vllm_open(server, ev, f["path"])
    elif kind == "vllm.managed":
        _vllm_open(server, ev, None, managed=True)
    elif kind == "vllm.running":
        s = server.ranks.get(ev.rank or "-")
        (s[-1] if s else _vllm_open(server, ev, None)).ran_dummy_pass = True


def _vllm_open(server: Server, ev: Event, path: str | None, managed: bool = False) -> Session:
    """vLLM's leader names the cache once (``info_once``); every rank reads its own file in that
    directory, so the other ranks' sessions open when they first speak."""
    s = _open(server, ev, path, managed=managed)
    return s


def assemble(servers: dict[str, Server], events: list[Event]) -> None:
    """Fold one log's events into ``servers`` (by server name)."""
    for ev in events:
        server = servers.setdefault(ev.server, Server(ev.server))
        server.lines += 1
        if ev.engine in ("sglang", "vllm") and server.engine in (None, "flashinfer") and ev.kind != "other":
            server.engine = ev.engine
        if ev.kind in ("flashinfer.bar", "flashinfer.bar_cut"):
            _bar(server, ev)
        elif ev.kind.startswith("flashinfer."):
            _flashinfer(server, ev)
        elif ev.kind != "other":
            _engine_line(server, ev)
    for server in servers.values():
        _finish(server)


def _finish(server: Server) -> None:
    """Drops apply to every rank of the dropping group in that round; vLLM sessions end with the
    log (vLLM prints no end line), SGLang's only at ``completed``."""
    for s in server.sessions():
        if (tp_group(s.rank), s.round) in server.dropped_rounds:
            s.dropped = True
        if s.engine == "vllm":
            s.complete = True
    if server.engine == "vllm":
        _spread_vllm(server)
        if vllm_world_size(server) > 1:
            _unattribute_bars(server)


def vllm_world_size(server: Server) -> int:
    """How many ranks of a vLLM server tune: its workers seen (by name or by file), or as many as
    its ``non-default args`` state (TP x PP x DP), whichever is more."""
    args = server.server_args or {}
    sizes = [args.get(k) for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")]
    world = 1
    for n in sizes:
        world *= n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
    return max(world, len(server.ranks))


def _unattribute_bars(server: Server) -> None:
    """A bar carries no rank and vLLM's ranks tune in step: bars read while one worker's session
    was the only one open (the others had not spoken yet) were any worker's. They are the
    server's, as on SGLang, not one rank's (whose time would add up every rank's bar)."""
    for s in server.sessions():
        if s.bars or s.cut_bars:
            server.shared_bars.extend(s.bars)
            server.shared_cut.extend(s.cut_bars)
            s.bars, s.cut_bars = [], []
            s.saw_shared_bars = True
    if server.shared_bars or server.shared_cut:
        for s in server.sessions():
            s.saw_shared_bars = s.saw_shared_bars or s.ran_dummy_pass or s.saved_new


def _spread_vllm(server: Server) -> None:
    """vLLM names the cache on its leader only; the other workers read the same entry."""
    lead = next((s for s in server.sessions() if s.path or s.managed), None)
    if lead is None:
        return
    for rank, sessions in server.ranks.items():
        if not sessions:
            sessions.append(Session(rank, lead.path, "vllm", managed=lead.managed, complete=True))
        for s in sessions:
            if s.path is None and not s.managed:
                s.path = lead.path
            s.managed = s.managed or lead.managed
