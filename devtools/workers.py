"""Worker processes for the reliability tests: ``python -m devtools.workers MODE ROOT ...``."""

from __future__ import annotations

import random
import sys
from pathlib import Path

from autotune_cache.tree.store.archive import import_archive
from autotune_cache.errors import EntryLocked
from autotune_cache.registry import default_layout
from autotune_cache.tree.delete import plan_prune
from autotune_cache.tree.select import EntryFilter
from autotune_cache.tree.scanner.scan import scan_cache
from autotune_cache.tree.status import EntryStatus
from devtools.synthetic import default_fields, write_fake_entry

MODELS = ("zai-org/GLM-5.1-FP8", "deepseek-ai/DeepSeek-V3", "moonshotai/Kimi-K2-Instruct")
SMALL_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def fields_for(i: int):
    return default_fields(MODELS[i % len(MODELS)], tp=4, dp=4)


def write_one(root: Path, rng: random.Random) -> None:
    write_fake_entry(root, fields=fields_for(rng.randrange(len(MODELS))), seed=rng.randrange(1000), buckets=SMALL_BUCKETS)


def main() -> None:
    mode, root = sys.argv[1], Path(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    rng = random.Random(hash((mode, sys.argv[-1])))
    if mode == "seed":
        for i in range(len(MODELS)):
            write_fake_entry(root, fields=fields_for(i), seed=100 + i, buckets=SMALL_BUCKETS)
    elif mode == "writer":
        for _ in range(rounds):
            write_one(root, rng)
    elif mode == "forever":
        print("started", flush=True)
        while True:
            write_one(root, rng)
    elif mode == "pruner":
        bad = (EntryStatus.INCOMPLETE, EntryStatus.CORRUPT, EntryStatus.DIVERGED)
        for _ in range(rounds):
            plan_prune(scan_cache(root), EntryFilter(statuses=bad)).execute()
    elif mode == "importer":
        archive = Path(sys.argv[4])
        for _ in range(rounds):
            try:
                with open(archive, "rb") as f:
                    import_archive(default_layout(), root, f, str(archive), force=rng.random() < 0.5)
            except EntryLocked:
                pass
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
