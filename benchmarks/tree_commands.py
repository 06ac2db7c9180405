"""Time the cache-tree commands on large trees, as whole processes.

Builds two trees of N entries (default 10,000), 8 rank files each at a realistic size: one
written by fi-autotune (with manifests), one as an engine writes it (rank files only, ~5.7 KB
each, so every file must be read). Times ``ls``, ``ls --json`` and ``prune --dry-run`` on each
(median of repeats, each a fresh process: what a user waits for) and checks with
``python -X importtime`` that ``ls`` imports neither torch nor flashinfer.

    python benchmarks/tree_commands.py [--entries 10000] [--repeat 5] [--out benchmarks/results/tree.json]

Target (issues 2 and 10): ``ls`` under 1 s for 10,000 entries of either kind on a 2-core machine.
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

from autotune_cache.plan.keys import KeyFields  # noqa: E402
from autotune_cache.registry import default_layout  # noqa: E402
from autotune_cache.tree.layout import MANIFEST_NAME  # noqa: E402
from autotune_cache.tree.manifest import RankRecord  # noqa: E402
from tests.synthetic import DEFAULT_METADATA, cache_file_bytes, fake_configs, make_manifest  # noqa: E402
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


def time_cmd(args: list[str], repeat: int, env: dict | None = None) -> dict:
    runs = []
    for _ in range(repeat + 1):  # the first run warms the page cache (and the index): not counted
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "fi_autotune_cli", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, env={**os.environ, **(env or {})})
        runs.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"{args} failed: {proc.stderr.decode()[-2000:]}")
    runs = runs[1:]
    return {"median_s": statistics.median(runs), "min_s": min(runs), "max_s": max(runs), "runs": runs}


def heavy_imports(args: list[str]) -> list[str]:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "fi_autotune_cli", *args], cwd=REPO,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    mods = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return sorted(mods & {"torch", "flashinfer", "numpy"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "tree_commands.json"))
    ap.add_argument("--keep", action="store_true", help="Keep the generated trees.")
    args = ap.parse_args()

    results: dict = {}
    sizes: dict = {}
    imports: list[str] = []
    for kind, with_manifest in (("fi-autotune (manifests)", True), ("engine-written (rank files only)", False)):
        tmp = Path(tempfile.mkdtemp(prefix="fi-autotune-bench-"))
        try:
            t0 = time.perf_counter()
            sizes[kind] = build_tree(tmp, args.entries, with_manifest)
            build_s = time.perf_counter() - t0
            cd = ["--cache-dir", str(tmp)]
            cases = {
                "ls": ["ls", *cd],
                "ls --json": ["ls", "--json", *cd],
                "prune --dry-run": ["prune", "--older-than", "0s", "--dry-run", *cd],
            }
            results[kind] = {}
            if not with_manifest:
                # The first ls of an engine-written tree reads every rank file (and fills the
                # digest index); "cold" forgets the index before every run.
                results[kind]["ls (cold: no index)"] = time_cmd(["ls", *cd], args.repeat, {"FI_AUTOTUNE_NO_INDEX": "1"})
            results[kind].update({name: time_cmd(a, args.repeat) for name, a in cases.items()})
            results[kind]["build_s"] = build_s
            if with_manifest:
                imports = heavy_imports(["ls", *cd])
        finally:
            if not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)
    floor = time_cmd(["--version"], args.repeat)

    print(f"{args.entries} entries x 8 rank files; {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"median of {args.repeat} fresh processes")
    print(f"{'tree':<34}{'command':<22}{'median s':>10}{'min s':>9}{'max s':>9}")
    for kind, cases in results.items():
        for name, r in cases.items():
            if name == "build_s":
                continue
            print(f"{kind:<34}{name:<22}{r['median_s']:>10.3f}{r['min_s']:>9.3f}{r['max_s']:>9.3f}")
    print(f"{'-':<34}{'--version (floor)':<22}{floor['median_s']:>10.3f}{floor['min_s']:>9.3f}{floor['max_s']:>9.3f}")
    print(f"heavy modules imported by ls: {imports or 'none'}")
    met = all(cases["ls"]["median_s"] < 1.0 for cases in results.values()) and not imports
    print(f"target (ls < 1 s on both trees, no torch/flashinfer import): {'met' if met else 'MISSED'}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "entries": args.entries, "rank_files_per_entry": 8, "rank_file_bytes": sizes,
        "cpus": os.cpu_count(), "python": platform.python_version(), "results": results, "floor": floor,
        "heavy_imports_in_ls": imports, "target_met": met,
    }, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
