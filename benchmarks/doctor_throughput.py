"""How fast ``doctor`` reads a log, in MB/s: ordinary logs and one-megabyte hostile lines.

    python benchmarks/doctor_throughput.py [--mb 1] [--repeat 3] [--out doctor_throughput.json]

Rows (median [min-max] of the repeats, CPU seconds of this process, so a busy machine's other jobs
count less):

* ``fixtures x N``: the recorded startup logs (tests/data/engine_logs/*.log) concatenated to
  ``--mb`` megabytes, through doctor's reader (``read_log``) and diagnosis (``diagnose``);
* ``1 MB line: <pattern>``: for each of doctor's line patterns, the line of its hostile family
  (tests/logs/test_linear_patterns.py) on which it works hardest, at 1 MiB, through ``read_log``;
* ``1 MB line: issue 44 ...``: the two lines the issue timed (100,000 spaces in a cache line: 42 s
  before; a line repeating FlashInfer's "was created in a different environment (": 49 s before),
  grown to 1 MiB;
* ``doctor CLI``: the whole command (a fresh process) on the concatenated logs, wall seconds.

Issue 44's bar: a 1 MB line costs at most a second on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autotune_cache.logs.diagnose import diagnose  # noqa: E402
from autotune_cache.logs.reader import read_log  # noqa: E402
from tests.logs.test_linear_patterns import EVERY, PATTERNS, hostile_lines  # noqa: E402
from tests.support.regex_steps import steps  # noqa: E402

MB = 1 << 20


def cpu(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        out.append(time.process_time() - t)
    return out


def worst_line(name: str) -> str:
    family = hostile_lines(name, 1000)
    worst = max(family, key=lambda w: steps(PATTERNS[name], family[w], name in EVERY))
    return hostile_lines(name, MB)[worst]


def issue_lines() -> dict[str, str]:
    cache = "[2026-06-29 01:38:00 TP0] Running FlashInfer autotune with cache: /p"
    env = "2026-06-29 01:38:00,123 - WARNING - autotuner.py:3769 - flashinfer.jit: [Autotuner]: Cache file /p"
    sep = " was created in a different environment ("
    return {"issue 44: spaces in a cache line": cache + " " * (MB - len(cache) - 1) + "x",
            "issue 44: repeated 'different environment ('": env + sep * ((MB - len(env)) // len(sep))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="doctor_throughput.json")
    a = ap.parse_args()
    rows: dict[str, dict] = {}

    def row(name: str, size: int, secs: list[float]) -> None:
        med = statistics.median(secs)
        rows[name] = {"bytes": size, "median_s": med, "min_s": min(secs), "max_s": max(secs),
                      "mb_per_s": size / MB / med if med else float("inf")}
        print(f"{name:<58} {size / MB:6.1f} MB {med:8.3f} s [{min(secs):.3f}-{max(secs):.3f}] "
              f"{rows[name]['mb_per_s']:9.1f} MB/s", flush=True)

    logs = "".join(p.read_text() for p in sorted((REPO / "tests" / "data" / "engine_logs").glob("*.log")))
    text = logs * (a.mb * MB // len(logs) + 1)
    size = len(text.encode())
    row(f"fixtures x {a.mb} MB: read_log", size, cpu(lambda: read_log("big.log", text), a.repeat))
    row(f"fixtures x {a.mb} MB: diagnose", size, cpu(lambda: diagnose([("big.log", text)], []), a.repeat))
    for name in PATTERNS:
        line = worst_line(name) + "\n"
        row(f"1 MB line: {name}", len(line.encode()), cpu(lambda: read_log("hostile.log", line), a.repeat))
    for name, line in issue_lines().items():
        row(f"1 MB line: {name}", len(line.encode()), cpu(lambda: read_log("hostile.log", line + "\n"), a.repeat))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.log"
        path.write_text(text)
        walls = []
        for _ in range(a.repeat):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "fi_autotune_cli", "doctor", str(path), "--json"], cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            walls.append(time.perf_counter() - t)
        row(f"doctor CLI, fixtures x {a.mb} MB (wall)", size, walls)
    worst = max((r["median_s"], n) for n, r in rows.items() if n.startswith("1 MB line"))
    print(f"slowest 1 MB line: {worst[1]} {worst[0]:.3f} s (bar: 1 s on 2 cores)")
    Path(a.out).write_text(json.dumps({"python": sys.version.split()[0], "cpus": os.cpu_count(), "repeat": a.repeat,
                                       "rows": rows}, indent=2))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
