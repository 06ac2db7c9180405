"""Time the cache-tree commands on a large tree, as whole processes.

Builds a tree of N key dirs (default 10,000), 8 rank files each at a realistic size, with
fi-autotune manifests, then times ``ls``, ``ls --json`` and ``prune --dry-run`` (median of
repeats, each a fresh process: what a user waits for) and checks with ``python -X importtime``
that ``ls`` imports neither torch nor flashinfer.

    python benchmarks/tree_commands.py [--entries 10000] [--repeat 5] [--out benchmarks/results/tree.json]

Target (issue 2): ``ls`` under 1 s for 10,000 entries on a 2-core machine.
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

from autotune_cache import layout  # noqa: E402
from autotune_cache.keys import KeyFields  # noqa: E402
from autotune_cache.layout import Topology  # noqa: E402
from autotune_cache.manifest import RankRecord  # noqa: E402
from autotune_cache.testing import DEFAULT_METADATA, cache_file_bytes, fake_configs, make_manifest  # noqa: E402


def build_tree(root: Path, n: int) -> int:
    """Write n entries directly (the writer's fsyncs would make building take minutes)."""
    data = cache_file_bytes(DEFAULT_METADATA, fake_configs())  # ~14 KB: 63 configs, 21 buckets
    topo = Topology(8, 1, 8)
    names = topo.rank_files()
    models = [f"org/model-{i}" for i in range(50)]
    versions = ["0.7.2.post1", "0.7.1", "0.6.9"]
    for i in range(n):
        fields = KeyFields(models[i % 50], "torch.bfloat16", "fp8", "flashinfer_trtllm", 8, 1, 8, 1 + i // 50, "GlmMoeDsaConfig")
        version = versions[i % 3]
        manifest = make_manifest(fields, topo, version, "sm100")
        kdir = layout.key_dir(root, version, "sm100", manifest.key)
        kdir.mkdir(parents=True)
        records = {}
        for name in names:
            p = kdir / name
            p.write_bytes(data)
            st = p.stat()
            records[name] = RankRecord(st.st_size, st.st_mtime_ns, "0" * 64, 63)
        (kdir / layout.MANIFEST_NAME).write_bytes(manifest.with_rank_records(records).to_bytes())
    return len(data)


def time_cmd(args: list[str], repeat: int) -> dict:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "fi_autotune_cli", *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        runs.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"{args} failed: {proc.stderr.decode()[-2000:]}")
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
    ap.add_argument("--keep", action="store_true", help="Keep the generated tree.")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="fi-autotune-bench-"))
    try:
        t0 = time.perf_counter()
        rank_size = build_tree(tmp, args.entries)
        build_s = time.perf_counter() - t0
        cd = ["--cache-dir", str(tmp)]
        cases = {
            "ls": ["ls", *cd],
            "ls --json": ["ls", "--json", *cd],
            "prune --dry-run": ["prune", "--older-than", "0s", "--dry-run", *cd],
            "--version (startup floor)": ["--version"],
        }
        results = {name: time_cmd(a, args.repeat) for name, a in cases.items()}
        imports = heavy_imports(["ls", *cd])
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    print(f"tree: {args.entries} entries x 8 rank files ({rank_size} B each), built in {build_s:.1f} s; "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"{'command':<28}{'median s':>10}{'min s':>9}{'max s':>9}")
    for name, r in results.items():
        print(f"{name:<28}{r['median_s']:>10.3f}{r['min_s']:>9.3f}{r['max_s']:>9.3f}")
    print(f"heavy modules imported by ls: {imports or 'none'}")
    target = results["ls"]["median_s"] < 1.0 and not imports
    print(f"target (ls < 1 s, no torch/flashinfer import): {'met' if target else 'MISSED'}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "entries": args.entries, "rank_files_per_entry": 8, "rank_file_bytes": rank_size,
        "cpus": os.cpu_count(), "python": platform.python_version(), "results": results,
        "heavy_imports_in_ls": imports, "target_met": target,
    }, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
