"""Reliability trials of the tree and store commands, counted: real processes, real kills, real files.

    python benchmarks/reliability.py                  # the tree trials: >= 100 kills, >= 50 rounds
    python benchmarks/reliability.py --short          # what CI runs (tests/tree/crashsafe/test_stress.py)
    python benchmarks/reliability.py --long           # every attack (about 25 min on 2 cores)
    python benchmarks/reliability.py --long --quick   # a few points of each family (development)
    python benchmarks/reliability.py --long --only "exact syscall kills: rm,HTTP"   # rows by substring

Trials, each a row of the table:

* concurrency: rounds of 8 processes (3 writers, 2 pruners, 3 importers) on one tree;
* kill at random times: ``import`` of a 30-entry archive, ``prune`` of 6 entries and a ``warm``-like
  writer, each SIGKILLed after a random delay, then checked with ``ls`` (which finishes any
  interrupted write) and repaired by re-running the command;
* kill at exact steps: every crash point of the write and delete paths
  (run through tests/standins/fault_cli.py), with and without ``RENAME_EXCHANGE``;
* malformed trees x 8 commands; hostile archives.

``--long`` adds (each a row, or a row per command):

* exact syscall kills: push, pull, import, export, convert, rm, prune, rm URL and prune URL
  (file:// store), each killed by ``strace -f -e inject=SYSCALL:signal=SIGKILL:when=N`` at every
  mutating syscall it makes on its own files (rename*, unlink*, rmdir, mkdir, link, write, fsync,
  ftruncate, openat for writing; listed by a dry run under strace; at most 38 per command,
  spread), each kill checked to land in the syscall aimed at; then the state checked, the same
  command run again, and the end state checked;
* hostile HTTP servers on loopback (``--timeout 1``): silent, trickling (inside and past the
  timeout), garbage bodies and status lines, not HTTP at all, endless bodies, a huge
  Content-Length, a gzip bomb, redirects to file://, in a loop and to another entry's object, a
  404 bundle; on the marker, one record, one bundle or the directory listing; each x ``ls URL``,
  ``pull URL``, ``pull URL ID``;
* look-alike names (newline, space, tab, CR, case, non-ASCII digits) in the sglang, vllm and
  flashinfer-v2 layouts: as dirs next to the real entry, and given to rm, show, export, pull URL;
* swapped and edited index records (file:// and a real S3 server, moto) x ls, pull, pull ID,
  rm URL ID, prune URL;
* archives with symlinks, hardlinks, device nodes, FIFOs, ``..``, absolute and sparse members,
  given to import and, as a bundle with its true sha256, to pull;
* 8 commands at once on one tree and one store (import, import --force, push, pull, rm, prune,
  export, rm URL), 3 of them SIGKILLed at random times, each killed one run again.

Columns (every failure column is a count of findings; the target is zero in each):

* attempts: commands run (for a kill: one kill point, its checks and its re-run count once);
* kills: attempts whose process died by SIGKILL (sent by us, by tests/standins/fault_cli.py's crash point, or by
  strace at the syscall aimed at);
* corrupt: a file a reader would take as finished that does not verify or parse: a rank file or
  manifest in a tree (not a temp, stage or trash name), a file of FlashInfer's managed store, a
  store index record that is not JSON, a bundle whose sha256 is not its name; or ``ls URL``
  failing on the store;
* lost: an entry complete before the command, not asked to be deleted, that is gone (or no
  longer complete) after the kill or after the re-run; in a store, no longer listed by ``ls URL``;
* half: something partly done visible as done: an entry ``ls`` lists as other than complete, some
  but not all entries of an all-or-none import or pull, a store record whose bundle is not
  there, a partial archive at export's output name, a pull that failed and installed anything;
* leftovers: what the killed command left that is still there after its re-run finished: trash,
  stage or journal dirs in a tree, our temp files (``.tmp-*`` in a file:// store,
  ``.fi-autotune-*.tmp`` in FlashInfer's store, temp files next to export's output), bundles that
  no index record names;
* unfinished: the re-run of a killed command exits non-zero, or leaves undone what it was asked
  (named or selected entries still there, no whole archive); at most one per attempt;
* tracebacks: a Python traceback on stderr (for the malformed trees also an exit status other
  than 0, 1, 2);
* hangs: a command still running past its limit (60 s; 30 s against a hostile server), or holding
  more than 1 GiB resident (then killed);
* wrong deletes: a delete that removed what it was not asked to: the real entry or a look-alike
  dir when a look-alike name was given (or by ``prune --status corrupt``), another entry's record
  or bundle in a store, anything outside the store;
* escapes: a file written or changed outside the command's destination (a victim dir next to the
  tree or store, the target of a link, ``..`` or absolute member, or of a file:// redirect);
* wrong installs: an entry installed, exported or shown that is not the one named, or whose bytes
  are not the honest entry's: a hostile archive or bundle that installed anything, a pulled entry
  whose rank files differ from those pushed under its id, a look-alike name that resolved (exit
  0), ``ls`` listing a look-alike dir.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from reliability_families.common import COLUMNS, FAILURES, Row, seeded  # noqa: E402
from reliability_families.trials import concurrency, hostile_archives, kill_at_random, kill_at_steps, malformed_trees  # noqa: E402
from reliability_families.exact import EXACT_CASES, exact_syscall_kills  # noqa: E402
from reliability_families.http import hostile_http  # noqa: E402
from reliability_families.names import look_alike_names  # noqa: E402
from reliability_families.records import MotoServer, edited_records  # noqa: E402
from reliability_families.archives import link_archives  # noqa: E402
from reliability_families.concurrent import concurrent_kills  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true", help="The CI form: a few of each trial.")
    ap.add_argument("--long", action="store_true", help="Every attack: the trials above plus exact-syscall kills, "
                    "hostile servers, look-alike names, edited store records, hostile archives, kills under load.")
    ap.add_argument("--quick", action="store_true", help="With --long: a few points of each family (development).")
    ap.add_argument("--only", default="", help="Comma-separated substrings of row names to run (e.g. 'exact,http').")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    sizes = dict(rounds=3, kills=6, steps=1, hostile=10, cap=4, ck=3) if args.short or args.quick else \
        dict(rounds=50, kills=102, steps=3, hostile=60)
    if args.long and not args.quick:  # every attack within about 25 minutes on 2 cores: fewer of the tree trials
        sizes.update(rounds=10, kills=60, hostile=30, cap=45, ck=8)
    out = Path(args.out or (REPO / "docs" / "results" / "reliability_long.json" if args.long and not args.quick
                            else REPO / "benchmarks" / "results" / "reliability.json"))
    only = [o.strip() for o in args.only.split(",") if o.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="fi-autotune-reliability-"))
    trials: list[tuple[str, object]] = []
    if not args.long or not args.quick:
        trials += [("concurrency (8 processes/round)", lambda: concurrency(tmp, sizes["rounds"])),
                   ("SIGKILL at random times", lambda: kill_at_random(tmp, sizes["kills"], rng)),
                   ("SIGKILL at exact steps", lambda: kill_at_steps(tmp, sizes["steps"])),
                   ("malformed trees x 8 commands", lambda: (seeded(tmp, 1, "good"), malformed_trees(tmp))[1]),
                   ("hostile archives", lambda: hostile_archives(tmp, rng, sizes["hostile"]))]
    if args.long:
        for case in EXACT_CASES:
            trials.append((f"exact syscall kills: {case.name}", lambda case=case: exact_syscall_kills(tmp, case(), sizes["cap"])))
        trials.append(("hostile HTTP servers x 3 commands", lambda: hostile_http(tmp, random.Random(args.seed + 1))))
        trials.append(("look-alike names x 3 layouts", lambda: look_alike_names(tmp)))
        trials.append(("edited store records (file://, S3)", lambda: edited_records(tmp, moto())))
        trials.append(("archives: links, devices, .., sparse", lambda: link_archives(tmp)))
        trials.append(("8 commands at once, 3 killed", lambda: concurrent_kills(tmp, sizes["ck"], rng)))
    servers: list[MotoServer] = []

    def moto() -> MotoServer | None:
        if not servers:
            try:
                import moto as _  # noqa: F401
            except ImportError:
                return None
            servers.append(MotoServer(tmp))
        return servers[0]

    rows: dict[str, Row] = {}
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    background = {"hostile HTTP servers x 3 commands"}  # mostly waiting on timeouts: beside the others
    results: dict[str, Row] = {}

    def one(name, run):
        t1 = time.perf_counter()
        results[name] = run()
        times[name] = time.perf_counter() - t1
        print(f"  {name}: {dict(results[name])} ({times[name]:.0f} s)", file=sys.stderr, flush=True)

    try:
        chosen = [(n, r) for n, r in trials if not only or any(o in n for o in only)]
        threads = [threading.Thread(target=one, args=t) for t in chosen if t[0] in background]
        for t in threads:
            t.start()
        for name, run in chosen:
            if name not in background:
                one(name, run)
        for t in threads:
            t.join()
        rows.update((n, results[n]) for n, _ in chosen if n in results)
    finally:
        for s in servers:
            s.close()
        shutil.rmtree(tmp, ignore_errors=True)
    total = Row()
    for r in rows.values():
        for c in COLUMNS:
            total[c] += r[c]
    rows["total"] = total
    width = max(len(n) for n in rows) + 2
    print(f"{'trial':<{width}}" + "".join(f"{c:>{max(len(c), 5) + 2}}" for c in COLUMNS))
    for name, r in rows.items():
        print(f"{name:<{width}}" + "".join(f"{r[c]:>{max(len(c), 5) + 2}}" for c in COLUMNS))
    for name, r in rows.items():
        for d in r.details:
            print(f"  {name}: {d}")
    failures = sum(total[c] for c in FAILURES)
    took = time.perf_counter() - t0
    print(f"{took:.0f} s; {total['kills']} kills; failures: {failures} ({'target met' if failures == 0 else 'TARGET MISSED'})")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"short": args.short, "long": args.long, "quick": args.quick, "only": only,
                               "seed": args.seed, "seconds": round(took), "columns": list(COLUMNS),
                               "rows": {n: {**r, "seconds": round(times.get(n, took)), "details": r.details}
                                        for n, r in rows.items()}}, indent=2))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
