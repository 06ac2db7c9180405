"""One warm worker: a process bound to one GPU that tunes the (op, bucket) profiles it is dealt.

``python -m autotune_cache.tune.worker``. Protocol (stdin from the parent, JSON lines on stdout):

1. The worker imports torch and flashinfer and creates its CUDA context while the parent is
   still planning (``imported``, ``cuda`` events), then reads one line: its task file's path
   (an empty line: nothing to do, exit).
2. It then reads work items ``"<op index> <bucket>"`` one per line, tuning each as it arrives
   (``start``, ``done``), until stdin closes; the parent deals the next item when one is done,
   so fast GPUs take more of the queue and no worker waits on a static share.
   Careful tuning (``quality.py``) adds two lines: ``flush`` (save what is pending now and say
   ``flushed``: the parent reads every tune's results before racing them) and
   ``race <spec path>`` (time the spec's candidate tactics head to head, ``race.py``; the
   result is written next to the spec, then ``raced``).
3. ``finished`` closes the run.

Each op's results go to the op's own FlashInfer cache file in the work dir (FlashInfer writes
it atomically, merged with what is on disk), and each saved bucket is appended to a done file,
so an interrupted warm resumes where it stopped. In careful mode a task op is one *tune* of an
op (several share one layer, ``"layer"``), and each done line also records which keys the
tune stored for that bucket and under which slot (``quality.SlotRecord``). Every event carries ``t`` (epoch seconds) so
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


def done_line(bucket: int, slots: list[dict] | None) -> str:
    """One done-file line: the bucket, and in careful mode what the tune stored for it."""
    if slots is None:
        return f"{bucket}\n"
    return f"{bucket} {json.dumps(slots, separators=(',', ':'))}\n"


class SlotRecorder:
    """Which keys one tune stored for one bucket, and under which slot (``quality.py``).

    FlashInfer stores a winner under the key of the runner that won; the slot is named by the
    key ``runners[0]`` would have (the runner FlashInfer falls back to with tactic -1). That
    key needs ``runners[0]``'s name and cache-key extras, which only the call knows: they are
    noted as ``choose_one`` is entered (extras are synthesis-invariant by FlashInfer's runner
    contract, so the call's own inputs give the bucket's)."""

    def __init__(self, tuner_cls):
        self.first_runner: dict[str, tuple[str, tuple]] = {}
        original = tuner_cls.choose_one
        recorder = self

        def choose_one(self, custom_op, runners, tuning_config, inputs, **kwargs):
            if runners and custom_op not in recorder.first_runner:
                try:
                    extras = runners[0].get_cache_key_extras(inputs)
                except Exception:  # noqa: BLE001 - unknown: the slot falls back to the stored key
                    extras = None
                if extras is not None:
                    recorder.first_runner[custom_op] = (runners[0].__class__.__name__, tuple(extras))
            return original(self, custom_op, runners, tuning_config, inputs, **kwargs)

        tuner_cls.choose_one = choose_one

    def slots(self, new_keys) -> list[dict]:
        import dataclasses

        out = []
        for k in new_keys:
            first = self.first_runner.get(k.custom_op)
            if first is None:
                slot, runner = k.file_key, k.runner_class_name
            else:
                runner = first[0]
                slot = dataclasses.replace(k, runner_class_name=runner, extras=first[1]).file_key
            out.append({"slot": slot, "key": k.file_key, "default_runner": runner})
        return out


def run_race(spec_path: str, layers, build_layer) -> dict:
    """Race the spec's candidates (``race.py``) and write the result beside the spec, atomically."""
    from pathlib import Path

    from autotune_cache.tune.race import race

    spec = json.loads(Path(spec_path).read_text())
    layer = build_layer(spec["layer"], spec["op"])
    result = race(layer, spec["bucket"], spec["assignments"], spec["metadata"], workdir=Path(spec_path).parent,
                  seed=spec.get("seed", 0), **spec["settings"])
    out = Path(spec["result"])
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out)
    return result


def main(task_path: str | None = None) -> int:
    t0 = time.perf_counter()
    import torch
    from flashinfer.autotuner import AutoTuner, autotune

    from autotune_cache.tune.lm_head import lm_head_stub
    from autotune_cache.tune.skeleton import OpLayer, SkeletonModel

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
    recorder = SlotRecorder(AutoTuner) if task.get("record_slots") else None
    tuner = AutoTuner.get()
    for name, value in (task.get("tuner") or {}).items():  # FlashInfer's own repeat counts
        if name in ("warmup", "repeat"):
            setattr(tuner, name, int(value))
    layers: dict[int, OpLayer] = {}
    timing = {"tune": 0.0, "jit": 0.0, "race": 0.0}
    current: int | None = None
    pending: list[str] = []
    last_save = time.perf_counter()

    def checkpoint(i: int) -> None:
        # FlashInfer writes the file atomically, merged with what is already on disk; the done
        # file names a bucket only once its results are in the op's file.
        t = task["ops"][i]
        tuner.save_configs(t["out"])
        with open(t["done"], "a") as f:
            f.write("".join(pending))
            f.flush()
            os.fsync(f.fileno())
        pending.clear()

    def build_layer(index: int, op: dict) -> OpLayer:
        # Built on first use: a worker only holds the weights of ops it is dealt. The first call
        # outside tuning loads (or JIT-builds) the kernel module, timed apart from tuning. The
        # tunes of one op share its layer (same weights, same seed).
        if index not in layers:
            t3 = time.perf_counter()
            layer = layers[index] = OpLayer(op, device, seed=index)
            model.layers.append(layer)
            with autotune(False):
                layer(1)
            torch.cuda.synchronize()
            timing["jit"] += time.perf_counter() - t3
        return layers[index]

    for line in sys.stdin:
        line = line.strip()
        if not line:
            break
        if line == "flush":
            if current is not None and pending:
                checkpoint(current)
            emit("flushed")
            continue
        if line.startswith("race "):
            spec_path = line.split(None, 1)[1]
            if current is not None and pending:
                checkpoint(current)
            t5 = time.perf_counter()
            try:
                result = run_race(spec_path, layers, build_layer)
            except Exception as e:  # noqa: BLE001 - reported with the spec's name
                emit("error", op=None, bucket=None, message=f"race {os.path.basename(spec_path)} failed: "
                     f"{type(e).__name__}: {str(e)[:500]}")
                return 3
            timing["race"] += time.perf_counter() - t5
            current = None  # the race cleared FlashInfer's in-memory cache
            emit("raced", spec=spec_path, seconds=time.perf_counter() - t5, errors=sum(e is not None for e in result["errors"]))
            continue
        i, bucket = parse_item(line)
        top = task["ops"][i]
        op = top["op"]
        if i != current:
            if current is not None:
                checkpoint(current)
            tuner.clear_cache()  # this op's file gets this op's entries only
            current, last_save = i, time.perf_counter()
        try:
            layer = build_layer(top.get("layer", i), op)
        except Exception as e:  # noqa: BLE001 - reported with the op's name
            emit("error", op=op["id"], bucket=None, message=f"first call failed: {type(e).__name__}: {str(e)[:500]}")
            return 3
        emit("start", op=op["id"], bucket=bucket)
        before = set(tuner.profiling_cache) if recorder else None
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
        timing["tune"] += dt
        slots = recorder.slots([k for k in tuner.profiling_cache if k not in before]) if recorder else None
        pending.append(done_line(bucket, slots))
        if time.perf_counter() - last_save >= CHECKPOINT_S:
            checkpoint(i)
            last_save = time.perf_counter()
        emit("done", op=op["id"], bucket=bucket, profiles=len(op["custom_ops"]), seconds=dt, item=f"{i} {bucket}")
    if current is not None and pending:
        checkpoint(current)
    emit("finished", tune_s=timing["tune"], jit_s=timing["jit"], race_s=timing["race"],
         peak_mem=torch.cuda.max_memory_allocated(device), floor_s=floor[0] if floor else None)
    return 0


if __name__ == "__main__":
    rc = main(sys.argv[1] if len(sys.argv) > 1 else None)
    sys.stdout.flush()
    sys.stderr.flush()
    # Every result is on disk (fsynced) by now; skip tearing down torch and the CUDA context
    # in Python, which only delays the parent's merge.
    os._exit(rc)
