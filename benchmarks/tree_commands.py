"""Time the cache-tree commands on large trees, as whole processes.

Builds two trees of N entries (default 10,000), 8 rank files each at a realistic size: one
written by fi-autotune (with manifests), one as an engine writes it (rank files only, ~5.7 KB
each, so every file must be read). Times ``ls``, ``ls -q``, ``ls --json`` and ``prune --dry-run``
on each (each a fresh process: what a user waits for), interleaved round by round with the
*floor*: one Python process that walks the same tree, stats every file and prints one line per
entry (``--floor ROOT`` runs it). Prints medians, peak RSS and each command's ratio to the floor,
and checks with ``python -X importtime`` that ``ls`` imports neither torch nor flashinfer.

    python benchmarks/tree_commands.py [--entries 10000] [--repeat 5] [--out benchmarks/results/tree_commands.json]

Building 100,000 entries takes minutes: ``--tree DIR`` builds the engine-written tree there once and
reuses it on later runs (``--engine-only``). ``--baseline CHECKOUT`` times another checkout's ``ls``
(say the commit before a change, ``git worktree add /tmp/old <commit>``) interleaved in the same
rounds, each with its own digest index (its own ``XDG_CACHE_HOME``); ``--cases`` picks commands.

Targets: ``ls`` at most 2.0x the floor on 10,000 engine-written entries on 2 cores (issue 24);
``ls -q`` and ``ls --json`` memory flat in the number of entries (issue 22: compare the peak RSS
of ``--entries 10000`` and ``--entries 100000``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autotune_cache.plan.entry_key import KeyFields  # noqa: E402
from autotune_cache.registry import default_layout  # noqa: E402
from autotune_cache.tree.layouts.own_names import MANIFEST_NAME  # noqa: E402
from autotune_cache.tree.manifest import RankRecord  # noqa: E402
from devtools.synthetic import DEFAULT_METADATA, cache_file_bytes, fake_configs, make_manifest  # noqa: E402
from autotune_cache.plan.topology import Topology  # noqa: E402

#: 9 buckets x 3 ops: ~5.7 KB, the size of the engine-written files seen in the field report.
ENGINE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def build_tree(root: Path, n: int, with_manifest: bool) -> int:
    """Write n entries directly (the writer's fsyncs would make building take minutes)."""
    layout = default_layout()
    buckets = None if with_manifest else ENGINE_BUCKETS
    configs = fake_configs() if with_manifest else fake_configs(buckets=buckets)
    topo = Topology(8, 1, 8)
    names = topo.rank_files()
    models = [f"org/model-{i}" for i in range(50)]
    versions = ["0.7.2.post1", "0.7.1", "0.6.9"]
    for i in range(n):
        fields = KeyFields(models[i % 50], "torch.bfloat16", "fp8", "flashinfer_trtllm", 8, 1, 8, 1 + i // 50, "GlmMoeDsaConfig")
        version = versions[i % 3]
        # each entry its own tactics (a seed per entry), identical across its ranks
        data = cache_file_bytes({**DEFAULT_METADATA, "flashinfer_version": version},
                                fake_configs(buckets=buckets, seed=i) if buckets else configs)
        manifest = make_manifest(fields, topo, version, "sm100")
        kdir = layout.entry_dir(root, layout.make_id((version, "sm100", manifest.key)))
        kdir.mkdir(parents=True)
        records = {}
        for name in names:
            p = kdir / name
            p.write_bytes(data)
            st = p.stat()
            records[name] = RankRecord(st.st_size, st.st_mtime_ns, "0" * 64, len(configs), st.st_ctime_ns)
        if with_manifest:
            (kdir / MANIFEST_NAME).write_bytes(manifest.with_rank_records(records).to_bytes())
    return len(data)


def floor(root: str) -> None:
    """The floor ``ls`` is measured against: walk, stat every file, one line per entry."""
    base = os.path.join(root, "flashinfer", "autotune")
    lines = []
    for version in sorted(os.scandir(base), key=lambda d: d.name):
        if version.name.startswith(".") or not version.is_dir(follow_symlinks=False):
            continue
        for arch in sorted(os.scandir(version.path), key=lambda d: d.name):
            for key in sorted(os.scandir(arch.path), key=lambda d: d.name):
                size = count = newest = 0
                for f in os.scandir(key.path):
                    st = f.stat(follow_symlinks=False)
                    size, count, newest = size + st.st_size, count + 1, max(newest, st.st_mtime_ns)
                lines.append(f"{version.name}/{arch.name}/{key.name}  {count}  {size}  {newest}")
    sys.stdout.write("\n".join(lines) + "\n")


class Case(list):
    """argv of a command, run in ``cwd`` (another checkout: its own code) with ``env`` added."""

    def __init__(self, argv, cwd: Path = REPO, env: dict | None = None):
        super().__init__(argv)
        self.cwd, self.env = cwd, env or {}


def run_once(argv: list[str], env: dict | None = None) -> float:
    """Wall seconds of one fresh process."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=getattr(argv, "cwd", REPO), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          env={**os.environ, **(env or {}), **getattr(argv, "env", {})})
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed: {proc.stderr.decode()[-2000:]}")
    return time.perf_counter() - t0


def peak_rss(argv: list[str], env: dict | None = None) -> tuple[int, float]:
    """Peak RSS of one run on its own (the child's ru_maxrss, as /usr/bin/time reads it), and the
    CPU seconds it and its forked scanners used (user + system: what a loaded machine cannot blur
    as much as wall time)."""
    proc = subprocess.Popen(argv, cwd=getattr(argv, "cwd", REPO), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **(env or {}), **getattr(argv, "env", {})})
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def time_cases(cases: dict[str, list[str]], repeat: int, env: dict | None = None) -> dict:
    """Median wall of each case, the cases interleaved round by round (so drifting load hits all
    alike); one warm-up round (page cache, digest index) is not counted."""
    runs: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(repeat + 1):
        for name, argv in cases.items():
            wall = run_once(argv, env)
            if r:
                runs[name].append(wall)
    out = {}
    for name, argv in cases.items():
        w = runs[name]
        rss, cpu = peak_rss(argv, env)
        out[name] = {"median_s": statistics.median(w), "min_s": min(w), "max_s": max(w), "runs": w,
                     "peak_rss_bytes": rss, "cpu_s": cpu, "load_avg_1m_end": os.getloadavg()[0]}
    return out


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "fi_autotune_cli", *args]


def baseline_cli(checkout: Path, cache_home: Path, *args: str) -> Case:
    """The same command from another checkout: run there, its ``cli/`` imported as the package
    (this venv's editable install points at this checkout's), with its own digest index."""
    code = ("import sys, importlib.util as u; s = u.spec_from_file_location('fi_autotune_cli', 'cli/__init__.py', "
            "submodule_search_locations=['cli']); m = u.module_from_spec(s); sys.modules['fi_autotune_cli'] = m; "
            "s.loader.exec_module(m); sys.argv[0] = 'fi-autotune'; from fi_autotune_cli.main import console_main; "
            "console_main()")
    return Case([sys.executable, "-c", code, *args], cwd=checkout, env={"XDG_CACHE_HOME": str(cache_home)})


CASES = ("cold", "floor", "ls", "ls -q", "ls --json", "prune --dry-run")


def heavy_imports(args: list[str]) -> list[str]:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "fi_autotune_cli", *args], cwd=REPO,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    mods = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return sorted(mods & {"torch", "flashinfer", "numpy"})


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--floor":
        return floor(sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "tree_commands.json"))
    ap.add_argument("--keep", action="store_true", help="Keep the generated trees.")
    ap.add_argument("--engine-only", action="store_true", help="Only the engine-written tree (the ls target).")
    ap.add_argument("--tree", type=Path, default=None,
                    help="Engine-written tree to use (built there when absent, kept); implies --engine-only.")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="Another checkout whose ls runs in the same rounds (its own digest index).")
    ap.add_argument("--cases", default=",".join(CASES), help=f"Comma-separated, of: {', '.join(CASES)}.")
    args = ap.parse_args()
    wanted = [c.strip() for c in args.cases.split(",")]
    if args.tree is not None:
        args.engine_only = True

    results: dict = {}
    sizes: dict = {}
    imports: list[str] = []
    kinds = (("fi-autotune (manifests)", True), ("engine-written (rank files only)", False))
    for kind, with_manifest in kinds[1:] if args.engine_only else kinds:
        given = args.tree is not None
        tmp = args.tree if given else Path(tempfile.mkdtemp(prefix="fi-autotune-bench-"))
        try:
            t0 = time.perf_counter()
            built = tmp / "built.json"
            if given and built.is_file():
                info = json.loads(built.read_text())
                if info["entries"] != args.entries:
                    raise SystemExit(f"{tmp} holds {info['entries']} entries, not {args.entries}")
                sizes[kind] = info["rank_file_bytes"]
            else:
                tmp.mkdir(parents=True, exist_ok=True)
                sizes[kind] = build_tree(tmp, args.entries, with_manifest)
                if given:
                    built.write_text(json.dumps({"entries": args.entries, "rank_file_bytes": sizes[kind]}))
            build_s = time.perf_counter() - t0
            cd = ["--cache-dir", str(tmp)]
            cases = {
                "floor": [sys.executable, str(Path(__file__).resolve()), "--floor", str(tmp)],
                "ls": cli("ls", *cd),
                "ls -q": cli("ls", "-q", *cd),
                "ls --json": cli("ls", "--json", *cd),
                "prune --dry-run": cli("prune", "--older-than", "0s", "--dry-run", *cd),
            }
            cases = {k: v for k, v in cases.items() if k in wanted or k == "floor"}
            if args.baseline is not None:
                # a kept tree keeps the baseline's index beside it too (its first run fills it)
                home = (tmp.parent / f"{tmp.name}.baseline-cache" if given
                        else Path(tempfile.mkdtemp(prefix="fi-autotune-bench-baseline-cache-")))
                for name in [k for k in cases if k.startswith("ls")]:
                    cases[f"{name} (baseline)"] = baseline_cli(args.baseline.resolve(), home, *cases[name][3:])
            results[kind] = {}
            if not with_manifest and "cold" in wanted:
                # The first ls of an engine-written tree reads every rank file (and fills the
                # digest index); "cold" forgets the index before every run.
                results[kind].update({"ls (cold: no index)": time_cases({"x": cli("ls", *cd)}, args.repeat,
                                                                          {"FI_AUTOTUNE_NO_INDEX": "1"})["x"]})
            results[kind].update(time_cases(cases, args.repeat))
            results[kind]["build_s"] = build_s
            if not imports:
                imports = heavy_imports(["ls", *cd])
        finally:
            if not args.keep and not given:
                shutil.rmtree(tmp, ignore_errors=True)

    print(f"{args.entries} entries x 8 rank files; {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"median of {args.repeat} fresh processes, interleaved with the floor")
    print(f"{'tree':<34}{'command':<22}{'median s':>10}{'min s':>9}{'max s':>9}{'x floor':>9}{'peak RSS':>11}"
          f"{'CPU s':>8}")
    ratios = {}
    for kind, cases in results.items():
        base = cases["floor"]["median_s"]
        for name, r in cases.items():
            if name == "build_s":
                continue
            ratio = r["median_s"] / base
            ratios[(kind, name)] = ratio
            r["x_floor"] = ratio
            print(f"{kind:<34}{name:<22}{r['median_s']:>10.3f}{r['min_s']:>9.3f}{r['max_s']:>9.3f}{ratio:>9.2f}"
                  f"{r['peak_rss_bytes'] / 2**20:>9.0f}MB{r['cpu_s']:>8.2f}")
    print(f"heavy modules imported by ls: {imports or 'none'}")
    engine = "engine-written (rank files only)"
    met = ratios.get((engine, "ls"), 99) <= 2.0 and not imports
    print(f"target (ls <= 2.0x the floor on the engine-written tree, no torch/flashinfer import): "
          f"{'met' if met else 'MISSED'} ({ratios.get((engine, 'ls'), float('nan')):.2f}x)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "entries": args.entries, "baseline": str(args.baseline) if args.baseline else None, "rank_files_per_entry": 8, "rank_file_bytes": sizes,
        "cpus": os.cpu_count(), "python": platform.python_version(), "results": results,
        "heavy_imports_in_ls": imports, "target_met": met,
    }, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
