"""FlashInfer's ``_collect_metadata()`` on this machine's first GPU, read in a child process.

A plan into FlashInfer's managed store is keyed by the environment that tunes it (the hash of
those fields names its directory), so ``warm`` needs them before it decides whether the store
already serves the plan. The parent stays free of torch and of a CUDA context (the workers own
the devices): ``python -m autotune_cache.tune.workers.envprobe`` prints the fields as one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from autotune_cache.autotuner.fingerprint import FIELDS, this_host
from autotune_cache.errors import FiAutotuneError

PROBE_ARGV = (sys.executable, "-m", "autotune_cache.tune.workers.envprobe")
TIMEOUT_S = 300


def probe_environment(argv: tuple[str, ...] = PROBE_ARGV) -> dict:
    """The metadata FlashInfer writes on the first visible GPU (raises FiAutotuneError with why)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible.split(",")[0].strip() if visible else "0"}
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FiAutotuneError(f"cannot read FlashInfer's environment on this GPU: {e}") from None
    try:
        fields = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
    except (ValueError, IndexError):
        fields = None
    if not isinstance(fields, dict) or any(not isinstance(fields.get(f), str) for f in FIELDS):
        why = (out.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise FiAutotuneError(f"cannot read FlashInfer's environment on this GPU ({why})")
    return {f: fields[f] for f in FIELDS}


def main() -> None:
    print(json.dumps(this_host().fields))


if __name__ == "__main__":
    main()
