"""``doctor``: from startup logs to one report per server and rank, each tuning pass with its cause.

The report answers what a user asks of a slow boot: which cache did each rank read, was it used,
dropped, absent or ignored, what was tuned and for how long, and why - in one line, in the words
``check`` uses for a miss. Reading never writes; nothing here imports torch or flashinfer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from autotune_cache.logs.boot import Server, Session, assemble, lockstep_ranks
from autotune_cache.logs.dialect import LogDialect
from autotune_cache.logs.formats import dialect_of, engine_dialect, labels, layout_dialect, understood
from autotune_cache.logs.library import LIBRARY
from autotune_cache.logs.reader import LogText, read_log
from autotune_cache.logs import fix as fixes
from autotune_cache.logs.trees import Located, Trees, locate, root_of
from autotune_cache.tree.nearest import same_key_elsewhere
from autotune_cache.tree.status import EntryStatus

#: cause kinds, for ``--json`` and scripts
NO_ENTRY, OTHER_ENV, DIVERGED, NOT_COVERED = "no-entry", "other-environment", "diverged", "not-covered"
REUSE_OFF, TRUNCATED, UNKNOWN = "reuse-disabled", "truncated", "unknown"


@dataclass
class DoctorReport:
    servers: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def tuned(self) -> bool:
        return any(s["tuned"] for s in self.servers)

    def to_dict(self) -> dict:
        return {"tuned": self.tuned, "understood": understood(), "warnings": self.warnings,
                "servers": self.servers}


def _ops(bars: list[dict]) -> list[dict]:
    """Each bar is one tuning of one op on one rank (a redraw printed on a line of its own, as a
    terminal capture keeps it, is the same bar; so is the final state tqdm prints again when the
    bar closes: the same count and elapsed time with the average rate in place of the smoothed
    one, seen on a real GPU's log - identical lines are two ranks' bars)."""
    out: list[dict] = []
    for b in bars:
        prev = out[-1] if out else None
        same = prev is not None and prev["op"] == b["op"] and prev["profiles"] == b["total"]
        if same and ((prev["done"] < prev["profiles"] and prev["done"] <= b["n"])
                     or (prev["done"] == b["n"] == b["total"] and prev["seconds"] == b["seconds"]
                         and prev["rate"] != b["rate"])):
            out.pop()
        out.append({"op": b["op"], "profiles": b["total"], "done": b["n"], "seconds": b["seconds"], "rate": b["rate"]})
    return [{k: v for k, v in o.items() if k != "rate"} for o in out]  # the rate only told redraws apart


def _shared(ops: list[dict]) -> list[dict]:
    """Rank-less bars of a multi-rank server (``_ops`` of them), by op: how many bars, and the longest."""
    by_op: dict[str, dict] = {}
    for o in ops:
        d = by_op.setdefault(o["op"], {"op": o["op"], "bars": 0, "profiles": 0, "done": 0, "seconds": 0})
        d["bars"] += 1
        d["profiles"], d["done"] = max(d["profiles"], o["profiles"]), max(d["done"], o["done"])
        d["seconds"] = max(d["seconds"], o["seconds"])
    return list(by_op.values())


def lockstep_seconds(ops: list[dict], ranks: int) -> int:
    """How long the server spent in bars that name no rank: ``ranks`` ranks tune in step, each
    printing its own bar, so the bars of one op are divided among them, never added up (4 ranks
    x 54 s is 54 s, not 216). Where one rank is all the log shows, identical bars (the same op,
    profiles, count and time) are copies from ranks that did not speak. Per op: at least its
    longest bar."""
    by_op: dict[tuple, list[dict]] = {}
    for o in ops:
        by_op.setdefault((o["op"], o["profiles"]), []).append(o)
    total = 0
    for bars in by_op.values():
        secs = [b["seconds"] or 0 for b in bars]
        copies = ranks if ranks > 1 else max(Counter((b["done"], b["seconds"]) for b in bars).values())
        total += max(max(secs), round(sum(secs) / copies))
    return total


def _elapsed(a: str | None, b: str | None) -> int | None:
    for fmt in ("%Y-%m-%d %H:%M:%S", "%m-%d %H:%M:%S"):
        try:
            return int((datetime.strptime(b, fmt) - datetime.strptime(a, fmt)).total_seconds())
        except (TypeError, ValueError):
            continue
    return None


def _dialect(name: str | None) -> LogDialect:
    """The dialect a session or layout's engine speaks (FlashInfer's own where none is known)."""
    return dialect_of(name) or LIBRARY


def _dialect_of_layout(loc: Located) -> LogDialect:
    """The dialect of the engine whose tree the server's path is in."""
    return layout_dialect(loc.layout.name) or LIBRARY


def _diverged_cause(s: Session, server: Server, trees: Trees, loc: Located | None) -> str:
    d = _dialect(s.engine)
    line = d.diverged
    entry = trees.entry(loc) if loc else None
    ep = (entry.manifest.key_fields.ep if entry and entry.manifest else None) or d.ep_size(server.server_args)
    if entry is not None and entry.status is EntryStatus.COMPLETE:
        line += (f"; ours ({entry.id}) are byte-identical, so the server's files were not all ours "
                 "(one written by the engine itself, or a partial copy)")
    elif entry is not None:
        line += f"; our entry {entry.id} is {entry.status.value}"
    if isinstance(ep, int) and ep > 1 and d.diverged_ep_note:
        line += "; " + d.diverged_ep_note.format(ep=ep)
    return line


def _absent_cause(s: Session, server: Server, trees: Trees, loc: Located) -> tuple[str, str]:
    root = trees.root(loc.layout)
    if s.managed:
        others = [str(c.id) for c in trees.candidates(loc.layout)]
        if others:
            return OTHER_ENV, (f"no store for the server's environment ({loc.id.name}) in {root}: ours is for "
                               f"another environment ({', '.join(others[:3])}); tune in the serving image")
        return NO_ENTRY, f"no store {loc.id} in {root}"
    why, _fields = _dialect_of_layout(loc).explain_key_miss(trees, loc, server.server_args)
    return NO_ENTRY, f"no entry {loc.id} in {root}" + (f": {why}" if why else " (and no other entry to compare with)")


def _present_cause(s: Session, loc: Located, entry, ops: list[dict]) -> tuple[str, str]:
    if entry.status is not EntryStatus.COMPLETE and entry.status is not EntryStatus.UNVERIFIED:
        kind = DIVERGED if entry.status is EntryStatus.DIVERGED else UNKNOWN
        return kind, f"our entry {entry.id} is {entry.status.value}: " + "; ".join(entry.problems[:2])
    ops_held = loc.layout.entry_ops(entry.rank_files, prefer=loc.file)
    have = None if ops_held is None else {s.custom_op: s.buckets for s in ops_held}
    tuned = list(dict.fromkeys(o["op"] for o in ops))
    if have is not None:
        missing = [op for op in tuned if op not in have]
        if missing:
            return NOT_COVERED, (f"entry {entry.id} has no {', '.join(missing)}: an op our plan does not cover "
                                 "(a planner bug: please report it with this log)")
    named = ", ".join(tuned) or "ops the log does not name"
    return NOT_COVERED, (f"entry {entry.id} is there, yet the server tuned {named}: a bucket our plan does not "
                         "cover (a planner bug: please report it), or an environment FlashInfer rejected "
                         "(fi-autotune check --env-from)")


def _cause(s: Session, server: Server, trees: Trees, ops: list[dict]) -> tuple[str | None, str | None]:
    if not s.complete:
        last = ops[-1] if ops else None
        where = f" (tuning {last['op']}, {last['done']}/{last['profiles']} profiles)" if last else ""
        return TRUNCATED, f"the log ends while {s.rank} was in its autotune pass{where}: cut short, or the server died"
    if s.reuse_disabled:
        return REUSE_OFF, _dialect(s.engine).reuse_off[0]
    if not s.tuned:
        return None, None
    loc = locate(s.path) if s.path else None
    if s.dropped:
        return DIVERGED, _diverged_cause(s, server, trees, loc)
    if s.other_env:
        return OTHER_ENV, f"the file was written in another environment ({s.other_env}): FlashInfer ignores it whole"
    if loc is None:
        return UNKNOWN, (f"{s.path} is in no tree layout fi-autotune knows" if s.path else
                         "the log does not name the cache the server read")
    if trees.info(loc.layout) is None:
        return UNKNOWN, (f"entry {loc.id} did not cover {', '.join(dict.fromkeys(o['op'] for o in ops)) or 'the pass'}; "
                         f"no {loc.layout.name} tree at {trees.root(loc.layout)} to say why (give --cache-dir)")
    entry = trees.entry(loc)
    if entry is None:
        return _absent_cause(s, server, trees, loc)
    return _present_cause(s, loc, entry, ops)


def _fix(s: Session, server: Server, trees: Trees, kind: str | None, loc: Located | None,
         store: str | None) -> fixes.Fix | None:
    """The command that makes this pass's next boot a hit, and where to run it."""
    if kind in (None, TRUNCATED):
        return None
    if kind == REUSE_OFF:
        return fixes.Fix(_dialect(s.engine).reuse_off[1], "in the server's environment, then restart it")
    root = root_of(s.path, loc) if loc and s.path else None
    engine = engine_dialect(server.engine)
    has_tree = loc is not None and trees.info(loc.layout) is not None
    entry = trees.entry(loc) if has_tree else None
    # a key only the engine computes: the fix carries it (the entry's name) to warm
    opaque_key = loc.id.name if loc is not None and _dialect_of_layout(loc).key_option else None
    fields, where = None, None
    if kind == NO_ENTRY and has_tree:
        same = same_key_elsewhere(loc.id, loc.layout, trees.candidates(loc.layout))
        if same is not None:
            fields = same[0].key_fields
            there = dict(same[1])
            if "arch" in there:
                where = f"on a {there['arch'][1]} GPU, in the serving image"
            else:
                where = f"in the serving image, with FlashInfer {there['flashinfer_version'][1]}"
        else:
            fields = _dialect_of_layout(loc).explain_key_miss(trees, loc, server.server_args)[1]
    warm = fixes.warm(engine, server.server_args, fields, root, opaque_key, store)
    if kind == DIVERGED:
        if entry is not None and entry.status is EntryStatus.COMPLETE:
            return fixes.Fix(fixes.export_import(str(entry.id), engine, root, loc.layout.name, str(trees.root(loc.layout))),
                             "export here, import where the server's tree is built")
        return fixes.Fix(warm, "in the serving image")
    if kind == OTHER_ENV:
        return fixes.Fix(warm, "in the serving image (FlashInfer keeps a tuning for the environment it was made in)")
    if kind == NOT_COVERED:
        if entry is not None and s.loaded is None and not s.hits and root and root != str(trees.root(loc.layout)):
            return fixes.Fix(fixes.export_import(str(entry.id), engine, root, loc.layout.name, str(trees.root(loc.layout))),
                             "if the server's tree lacks our entry (the log shows no load of it)")
        cmd = fixes.server_command(engine, server.server_args)
        return fixes.Fix("fi-autotune check --strict --env-from env.json -- "
                         + (fixes.shell(cmd) if cmd else "<the server's command>"),
                         "env.json from `fi-autotune env --json` in the serving image; a bucket it does not "
                         "name is a planner bug: report it with this log")
    if kind == NO_ENTRY and store and loc is not None:
        return fixes.Fix(fixes.pull(store, str(loc.id), root),
                         f"where the server's tree is built; if {store} lacks it: {warm}")
    if kind in (NO_ENTRY, UNKNOWN) and loc is not None:
        return fixes.Fix(warm, where or "in the serving image")
    return None


def _cache_state(s: Session, kind: str | None, entry_present: bool | None) -> str:
    if s.reuse_disabled:
        return "disabled"
    if s.dropped:
        return "dropped"
    if s.other_env:
        return "other-environment"
    if kind in (NO_ENTRY, OTHER_ENV) or (kind is None and s.tuned and entry_present is False):
        return "absent" if kind == NO_ENTRY else "other-environment"
    if s.loaded is not None or s.hits or (s.preloaded and s.preloaded[0]):
        return "loaded"
    if not s.tuned and s.complete:
        return "used"  # nothing was tuned: every lookup the pass made was answered
    return "unknown" if not s.tuned else "missed"


def _session_dict(s: Session, server: Server, trees: Trees, shared_ops: list[dict], store: str | None = None) -> dict:
    """``shared_ops``: the server's rank-less bars as ops, read once per server (not per session:
    a log of many passes would read them once per pass)."""
    ops = _ops(s.bars)
    kind, cause = _cause(s, server, trees, ops or (shared_ops if s.saw_shared_bars else []))
    loc = locate(s.path) if s.path else None
    entry = trees.entry(loc) if loc and trees.info(loc.layout) is not None else None
    in_tree = None
    if loc is not None:
        in_tree = {"root": str(trees.root(loc.layout)), "present": entry is not None,
                   "status": entry.status.value if entry else None,
                   "worker": ("draft" if entry.manifest.key_fields.is_draft else "target")
                   if entry and entry.manifest else None}
    return {
        "cache_path": s.path, "layout": loc.layout.name if loc else None, "entry": str(loc.id) if loc else None,
        "server_root": root_of(s.path, loc) if loc and s.path else None, "in_tree": in_tree,
        "cache": _cache_state(s, kind, entry is not None if in_tree else None),
        "tuned": ops, "tuned_elsewhere": s.saw_shared_bars, "dummy_pass": s.ran_dummy_pass,
        "tuned_unreadable": sorted(set(s.cut_bars)),
        "tuning_seconds": (lockstep_seconds(ops, 1) if _dialect(s.engine).ranks_in_lockstep
                           else sum(o["seconds"] for o in ops)),
        "duration_seconds": _elapsed(s.started, s.ended), "complete": s.complete,
        "hits": sorted(set(s.hits)), "loaded_configs": s.loaded,
        "preloaded": list(s.preloaded) if s.preloaded else None,
        "cause_kind": kind, "cause": cause,
        "fix": fix.to_dict() if (fix := _fix(s, server, trees, kind, loc, store)) else None,
    }


def _server_dict(server: Server, trees: Trees, store: str | None = None) -> dict:
    shared_ops = _ops(server.shared_bars)
    ranks = [{"rank": rank, "sessions": [_session_dict(s, server, trees, shared_ops, store) for s in sessions]}
             for rank, sessions in sorted(server.ranks.items(), key=lambda kv: _rank_order(kv[0]))]
    shared = _shared(shared_ops)
    own = max((sum(x["tuning_seconds"] for x in r["sessions"]) for r in ranks), default=0)
    causes = Counter(x["cause"] for r in ranks for x in r["sessions"] if x["cause"])
    fix_of = {}
    for x in (x for r in ranks for x in r["sessions"] if x["cause"]):
        fix_of.setdefault(x["cause"], x["fix"])
    tuned = bool(shared) or bool(server.shared_cut) or any(x["cause"] for r in ranks for x in r["sessions"]) or \
        any(x["tuned"] or x["dummy_pass"] or x["tuned_unreadable"] for r in ranks for x in r["sessions"])
    return {
        "server": server.name, "engine": server.engine, "version": server.version, "ranks": ranks,
        "shared_tuning": shared, "shared_unreadable": sorted(set(server.shared_cut)),
        "tuning_seconds": own + lockstep_seconds(shared_ops, max(len(ranks), lockstep_ranks(server))),
        "tuned": tuned, "causes": [{"cause": c, "ranks": n, "fix": fix_of[c]} for c, n in causes.most_common()],
    }


def _rank_order(rank: str) -> tuple:
    digits = [int("".join(ch for ch in tok if ch.isdigit()) or 0) for tok in rank.replace("_", " ").split()]
    return (len(digits), digits, rank)


def _version_warnings(servers: dict[str, Server], report: DoctorReport) -> None:
    seen = set()
    for server in servers.values():
        d = engine_dialect(server.engine)
        if d is not None and server.version and not server.version.startswith(d.release):
            seen.add(f"{d.label} {server.version} (server {server.name})")
        for s in server.sessions():
            loc = locate(s.path) if s.path else None
            fields = loc.layout.id_fields(loc.id) if loc else {}
            version = fields.get("flashinfer_version")
            if version and version != LIBRARY.release:
                seen.add(f"{LIBRARY.label} {version} (server {server.name})")
    read = labels("and", releases=True)
    for what in sorted(seen):
        report.warnings.append(f"{what}: the log formats read are those of {read}; lines that changed since are not read")


def diagnose(logs: list[tuple[str, str]], roots: list[Path], store: str | None = None) -> DoctorReport:
    """Read ``logs`` ((name, text) pairs) and explain every server's boot against our trees."""
    report = DoctorReport()
    servers: dict[str, Server] = {}
    texts: list[LogText] = []
    for name, text in logs:
        parsed = read_log(name, text)
        texts.append(parsed)
        assemble(servers, parsed.events)
        if not parsed.events:
            report.warnings.append(f"{name}: no line of {labels('or')} in it")
    trees = Trees(roots)
    for server in servers.values():
        if not server.ranks and not server.shared_bars and not server.shared_cut:
            report.warnings.append(f"{server.name}: {server.engine or 'the engine'} did not autotune at startup "
                                   "(no autotune line in the log)")
    _version_warnings(servers, report)
    report.servers = [_server_dict(s, trees, store) for s in servers.values() if s.ranks or s.shared_bars or s.shared_cut]
    return report
