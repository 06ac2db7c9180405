"""What any fresh process that tunes with FlashInfer pays before its first measurement.

    python benchmarks/process_floor.py --repeat 3 --out process_floor.json    # on a GPU machine

Times whole `python -c ...` processes (median [min-max] of the repeats): the interpreter alone,
`import torch`, `import torch, flashinfer`, the same plus a CUDA context, and five full imports
at once (four warm workers and the CLI on a 4-GPU machine). These are the floor under
fi-autotune's own start-up, and equally under every engine rank's (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = {
    "python": "pass",
    "import torch": "import torch",
    "import torch, flashinfer": "import torch, flashinfer",
    "... + CUDA context": "import torch, flashinfer; torch.empty(1, device='cuda')",
}


def once(code: str, copies: int = 1) -> float:
    t = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(copies)]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit(f"failed: python -c {code!r}")
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="process_floor.json")
    a = ap.parse_args()
    once(CASES["import torch, flashinfer"])  # byte-compile once; not measured
    rows = {name: [once(code) for _ in range(a.repeat)] for name, code in CASES.items()}
    rows["5 x import torch, flashinfer at once"] = [once(CASES["import torch, flashinfer"], 5) for _ in range(a.repeat)]
    try:
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.split("\n")
        gpus = [g for g in gpus if g.strip()]
        machine = f"{len(gpus)} x {gpus[0]}" if gpus else "no GPU"
    except OSError:
        machine = "no GPU"
    results = {"machine": machine, "python": sys.version.split()[0], "cpus": os.cpu_count(), "repeat": a.repeat,
               "seconds": {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in rows.items()}}
    print(f"{'process':<40} {'wall s':>22}")
    for k, s in results["seconds"].items():
        print(f"{k:<40} {s['median']:>8.2f} [{s['min']:.2f}-{s['max']:.2f}]")
    Path(a.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
