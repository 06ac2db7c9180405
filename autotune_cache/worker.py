"""One warm worker: a process bound to one GPU that tunes the (op, bucket) profiles it is dealt.

``python -m autotune_cache.worker``. Protocol (stdin from the parent, JSON lines on stdout):

1. The worker imports torch and flashinfer and creates its CUDA context while the parent is
   still planning (``imported``, ``cuda`` events), then reads one line: its task file's path
   (an empty line: nothing to do, exit).
2. It then reads work items ``"<op index> <bucket>"`` one per line, tuning each as it arrives
   (``start``, ``done``), until stdin closes; the parent deals the next item when one is done,
   so fast GPUs take more of the queue and no worker waits on a static share.
3. ``finished`` closes the run.

Each op's results go to the op's own FlashInfer cache file in the work dir (FlashInfer writes
it atomically, merged with what is on disk), and each saved bucket is appended to a done file,
so an interrupted warm resumes where it stopped. Every event carries ``t`` (epoch seconds) so
the parent can lay the workers' phases on one time line.
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
    sys.stdout.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
    sys.stdout.flush()


#: Finished buckets are saved to the op's file at least this often (and whenever the op changes).
CHECKPOINT_S = 5.0


def parse_item(line: str) -> tuple[int, int]:
    op, bucket = line.split()
    return int(op), int(bucket)


def main(task_path: str | None = None) -> int:
    t0 = time.perf_counter()
    import torch
    from flashinfer.autotuner import AutoTuner, autotune

    from .lm_head import lm_head_stub
    from .skeleton import OpLayer, SkeletonModel

    t_import = time.perf_counter() - t0
    emit("imported", import_s=t_import)
    # The CUDA context costs a few hundred ms: create it before the task exists, not after.
    t1 = time.perf_counter()
    if not torch.cuda.is_available():
        emit("error", message="no CUDA device visible to the worker")
        return 2
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.empty(1, device=device)
    emit("cuda", cuda_s=time.perf_counter() - t1, gpu=torch.cuda.get_device_name(device))

    if task_path is None:
        task_path = sys.stdin.readline().strip()
        if not task_path:
            return 0  # the parent had nothing for us
    with open(task_path) as f:
        task = json.load(f)
    sk = task["skeleton"]
    t2 = time.perf_counter()
    model = SkeletonModel([], hidden=sk["hidden"], vocab=sk["vocab"], tp=sk["tp"], dp=sk["dp"], dtype=sk["dtype"], device=device)
    torch.cuda.synchronize()
    emit("ready", import_s=t_import, setup_s=time.perf_counter() - t2)

    floor = measure_floor(AutoTuner) if os.environ.get("FI_AUTOTUNE_FLOOR") == "1" else None
    tuner = AutoTuner.get()
    layers: dict[int, OpLayer] = {}
    tune_s = jit_s = 0.0
    current: int | None = None
    pending: list[int] = []
    last_save = time.perf_counter()

    def checkpoint(i: int) -> None:
        # FlashInfer writes the file atomically, merged with what is already on disk; the done
        # file names a bucket only once its results are in the op's file.
        t = task["ops"][i]
        tuner.save_configs(t["out"])
        with open(t["done"], "a") as f:
            f.write("".join(f"{b}\n" for b in pending))
            f.flush()
            os.fsync(f.fileno())
        pending.clear()

    for line in sys.stdin:
        if not line.strip():
            break
        i, bucket = parse_item(line)
        op = task["ops"][i]["op"]
        if i != current:
            if current is not None:
                checkpoint(current)
            tuner.clear_cache()  # this op's file gets this op's entries only
            current, last_save = i, time.perf_counter()
        if i not in layers:
            # Built on first use: a worker only holds the weights of ops it is dealt. The first
            # call outside tuning loads (or JIT-builds) the kernel module, timed apart from tuning.
            t3 = time.perf_counter()
            try:
                layer = layers[i] = OpLayer(op, device, seed=i)
                model.layers.append(layer)
                with autotune(False):
                    layer(1)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - reported with the op's name
                emit("error", op=op["id"], bucket=None, message=f"first call failed: {type(e).__name__}: {str(e)[:500]}")
                return 3
            jit_s += time.perf_counter() - t3
        layer = layers[i]
        emit("start", op=op["id"], bucket=bucket)
        t4 = time.perf_counter()
        try:
            with autotune(True, tuning_buckets=(bucket,)), lm_head_stub():
                model(lambda o, target=layer.op: 1 if o is target else None, lm_tokens=1)
            torch.cuda.synchronize()
        except torch.OutOfMemoryError as e:
            emit("error", op=op["id"], bucket=bucket, message=f"out of GPU memory: {str(e).splitlines()[0][:300]}")
            return 3
        except Exception as e:  # noqa: BLE001
            emit("error", op=op["id"], bucket=bucket, message=f"{type(e).__name__}: {str(e)[:500]}")
            return 3
        dt = time.perf_counter() - t4
        tune_s += dt
        pending.append(bucket)
        if time.perf_counter() - last_save >= CHECKPOINT_S:
            checkpoint(i)
            last_save = time.perf_counter()
        emit("done", op=op["id"], bucket=bucket, profiles=len(op["custom_ops"]), seconds=dt)
    if current is not None:
        checkpoint(current)
    emit("finished", tune_s=tune_s, jit_s=jit_s, peak_mem=torch.cuda.max_memory_allocated(device),
         floor_s=floor[0] if floor else None)
    return 0


if __name__ == "__main__":
    rc = main(sys.argv[1] if len(sys.argv) > 1 else None)
    sys.stdout.flush()
    sys.stderr.flush()
    # Every result is on disk (fsynced) by now; skip tearing down torch and the CUDA context
    # in Python, which only delays the parent's merge.
    os._exit(rc)
