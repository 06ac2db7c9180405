"""One warm worker: a process bound to one GPU that tunes the (op, bucket) profiles it is given.

``python -m autotune_cache.worker TASKS.json``. It reports JSON lines on stdout (ready, jit,
start, done, error, finished) that the parent turns into progress, timings and errors. Each op's
results go to the op's own FlashInfer cache file in the work dir (FlashInfer writes it
atomically on leaving each ``autotune`` block), and each finished bucket is appended to a done
file, so an interrupted warm resumes where it stopped.
"""

from __future__ import annotations

import json
import os
import sys
import time


def measure_floor(tuner_cls) -> list[float]:
    """Accumulate the wall time spent inside FlashInfer's per-tactic measurements (the "floor"
    benchmarks compare the tool's overhead against). Only used when FI_AUTOTUNE_FLOOR=1."""
    spent = [0.0]
    original = tuner_cls._profile_single_kernel

    def timed(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t

    tuner_cls._profile_single_kernel = timed
    return spent


def emit(event: str, **fields) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


#: Finished buckets are saved to the op's file at least this often (and at the end of each op).
CHECKPOINT_S = 5.0


def main(task_path: str | None) -> int:
    t0 = time.perf_counter()
    import torch
    from flashinfer.autotuner import AutoTuner, autotune

    from .lm_head import lm_head_stub
    from .skeleton import SkeletonModel

    t_import = time.perf_counter() - t0
    if task_path is None:
        # Started ahead of the plan: imports overlap the parent's planning; the task comes on stdin.
        emit("imported", import_s=t_import)
        task_path = sys.stdin.readline().strip()
        if not task_path:
            return 0  # the parent had nothing for us
    with open(task_path) as f:
        task = json.load(f)

    if not torch.cuda.is_available():
        emit("error", message="no CUDA device visible to the worker")
        return 2
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)

    ops = [t["op"] for t in task["ops"]]
    sk = task["skeleton"]
    t1 = time.perf_counter()
    model = SkeletonModel(ops, hidden=sk["hidden"], vocab=sk["vocab"], tp=sk["tp"], dp=sk["dp"], dtype=sk["dtype"], device=device)
    torch.cuda.synchronize()
    t_setup = time.perf_counter() - t1
    emit("ready", import_s=t_import, setup_s=t_setup, gpu=torch.cuda.get_device_name(device))

    # First calls outside tuning load or JIT-build each kernel module, timed apart from tuning.
    t2 = time.perf_counter()
    for layer in model.layers:
        current = layer.op
        try:
            with autotune(False):
                layer(1)
        except Exception as e:  # noqa: BLE001 - reported with the op's name
            emit("error", op=current["id"], bucket=None, message=f"first call failed: {type(e).__name__}: {str(e)[:500]}")
            return 3
    torch.cuda.synchronize()
    emit("jit", jit_s=time.perf_counter() - t2)

    floor = measure_floor(AutoTuner) if os.environ.get("FI_AUTOTUNE_FLOOR") == "1" else None
    tuner = AutoTuner.get()
    tune_s = 0.0
    for t, layer in zip(task["ops"], model.layers):
        tuner.clear_cache()  # this op's file gets this op's entries only
        out, done_path = t["out"], t["done"]
        pending: list[int] = []
        last_save = time.perf_counter()

        def checkpoint() -> None:
            # FlashInfer writes the file atomically, merged with what is already on disk.
            tuner.save_configs(out)
            with open(done_path, "a") as f:
                f.write("".join(f"{b}\n" for b in pending))
                f.flush()
                os.fsync(f.fileno())
            pending.clear()

        for bucket in t["buckets"]:
            emit("start", op=t["op"]["id"], bucket=bucket)
            t3 = time.perf_counter()
            try:
                with autotune(True, tuning_buckets=(bucket,)), lm_head_stub():
                    model(lambda op, layer_op=layer.op: 1 if op is layer_op else None, lm_tokens=1)
                torch.cuda.synchronize()
            except torch.OutOfMemoryError as e:
                emit("error", op=t["op"]["id"], bucket=bucket, message=f"out of GPU memory: {str(e).splitlines()[0][:300]}")
                return 3
            except Exception as e:  # noqa: BLE001
                emit("error", op=t["op"]["id"], bucket=bucket, message=f"{type(e).__name__}: {str(e)[:500]}")
                return 3
            dt = time.perf_counter() - t3
            tune_s += dt
            pending.append(bucket)
            if time.perf_counter() - last_save >= CHECKPOINT_S:
                checkpoint()
                last_save = time.perf_counter()
            emit("done", op=t["op"]["id"], bucket=bucket, profiles=len(t["op"]["custom_ops"]), seconds=dt)
        checkpoint()
    emit("finished", tune_s=tune_s, peak_mem=torch.cuda.max_memory_allocated(device), floor_s=floor[0] if floor else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
