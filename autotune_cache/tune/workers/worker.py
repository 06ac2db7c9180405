"""One warm worker: a process bound to one GPU that tunes the (op, bucket) profiles it is dealt.

``python -m autotune_cache.tune.workers.worker``. Protocol (stdin from the parent, JSON lines on stdout):

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
tune stored for that bucket and under which slot (``quality.SlotRecord``). Every event carries
``t`` (epoch seconds) so the parent can lay the workers' phases on one time line."""

from __future__ import annotations

import time

#: The worker's imports (torch, FlashInfer, the skeleton) are timed from here: they overlap the
#: parent's planning, and ``imported`` reports how long they took.
_T0 = time.perf_counter()

import dataclasses  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from flashinfer.autotuner import AutoTuner, autotune  # noqa: E402

from autotune_cache.tune.workers.kernel_modules import prebuild_on, watch as watch_kernel_modules  # noqa: E402
from autotune_cache.tune.workers.lm_head import lm_head_stub  # noqa: E402
from autotune_cache.tune.careful.quality import DEFAULT_TOP_K  # noqa: E402
from autotune_cache.tune.careful.race import run_spec  # noqa: E402
from autotune_cache.tune.workers.skeleton import OpLayer, SkeletonModel  # noqa: E402


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

    #: Runners-up kept per slot (careful races the first ``QualitySettings.top_k`` of them).
    ALTERNATIVES = DEFAULT_TOP_K

    def __init__(self, tuner_cls):
        self.first_runner: dict[str, tuple[str, tuple]] = {}
        self.timed: list[tuple] = []  # this tune's (custom op, runner, extras, tactic, ms)
        self._op: list[str] = []
        original = tuner_cls.choose_one
        profile = tuner_cls._profile_single_kernel
        recorder = self

        def choose_one(self, custom_op, runners, tuning_config, inputs, **kwargs):
            if runners and custom_op not in recorder.first_runner:
                try:
                    extras = runners[0].get_cache_key_extras(inputs)
                except Exception:  # noqa: BLE001 - unknown: the slot falls back to the stored key
                    extras = None
                if extras is not None:
                    recorder.first_runner[custom_op] = (runners[0].__class__.__name__, tuple(extras))
            recorder._op.append(custom_op)
            try:
                return original(self, custom_op, runners, tuning_config, inputs, **kwargs)
            finally:
                recorder._op.pop()

        def _profile_single_kernel(self, runner, inputs, tactic, tuning_config, *args, **kwargs):
            # FlashInfer times every (runner, tactic) of a profile here: its own ranking, whose
            # runners-up careful races too (a failure raises, and is not recorded).
            ms = profile(self, runner, inputs, tactic, tuning_config, *args, **kwargs)
            if recorder._op:
                try:
                    extras = tuple(runner.get_cache_key_extras(inputs))
                except Exception:  # noqa: BLE001 - no key: not offered
                    extras = None
                if extras is not None:
                    recorder.timed.append((recorder._op[-1], runner.__class__.__name__, extras, tactic, ms))
            return ms

        tuner_cls.choose_one = choose_one
        tuner_cls._profile_single_kernel = _profile_single_kernel

    def reset(self) -> None:
        self.timed.clear()

    def slots(self, new_keys, cache: dict | None = None) -> list[dict]:
        out = []
        for k in new_keys:
            first = self.first_runner.get(k.custom_op)
            if first is None:
                slot, runner = k.file_key, k.runner_class_name
            else:
                runner = first[0]
                slot = dataclasses.replace(k, runner_class_name=runner, extras=first[1]).file_key
            rec = {"slot": slot, "key": k.file_key, "default_runner": runner}
            won = (cache or {}).get(k)
            alt = self.alternatives(k, won[0] if isinstance(won, tuple) and won else None)
            if alt:
                rec["alt"] = alt
            out.append(rec)
        return out

    def alternatives(self, key, winner_tactic) -> list[list]:
        """The tune's fastest (runner, tactic) pairs for ``key``'s custom op after the winner, as
        [cache key, runner, tactic (JSON)]."""
        try:
            from flashinfer.autotuner.autotuner import _tactic_to_json
        except ImportError:  # pragma: no cover - older FlashInfer: plain tactics only
            def _tactic_to_json(t):
                return t
        timed = sorted((t for t in self.timed if t[0] == key.custom_op and t[4] is not None and t[4] == t[4]
                        and t[4] != float("inf")), key=lambda t: t[4])
        out, seen = [], {(key.runner_class_name, repr(winner_tactic))}
        for _, runner, extras, tactic, _ms in timed:
            if (runner, repr(tactic)) in seen:
                continue
            seen.add((runner, repr(tactic)))
            k = dataclasses.replace(key, runner_class_name=runner, extras=extras).file_key
            out.append([k, runner, _tactic_to_json(tactic)])
            if len(out) >= self.ALTERNATIVES:
                break
        return out


class _Failed(Exception):
    """An item the worker could not run; its error event is already out, the exit code here."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class Worker:
    """One worker's state over its run: the task, the layers built so far (a worker only holds
    the weights of ops it is dealt), the results not yet saved, and its timings."""

    def __init__(self, task: dict, device, model: SkeletonModel):
        self.task, self.device, self.model = task, device, model
        self.floor = measure_floor(AutoTuner) if os.environ.get("FI_AUTOTUNE_FLOOR") == "1" else None
        self.recorder = SlotRecorder(AutoTuner) if task.get("record_slots") else None
        self.tuner = AutoTuner.get()
        for name, value in (task.get("tuner") or {}).items():  # FlashInfer's own repeat counts
            if name in ("warmup", "repeat"):
                setattr(self.tuner, name, int(value))
        self.layers: dict[int, OpLayer] = {}
        self.timing = {"tune": 0.0, "jit": 0.0, "race": 0.0}
        self.current: int | None = None
        self.op_in_hand: str | None = None  # named on each kernel module it makes FlashInfer load
        self.pending: list[str] = []
        self.last_save = time.perf_counter()
        watch_kernel_modules(emit, lambda: self.op_in_hand)
        self.prebuilding = prebuild_on(device, [t["op"]["api"] for t in task["ops"]])

    def checkpoint(self, i: int) -> None:
        """FlashInfer writes the file atomically, merged with what is already on disk; the done
        file names a bucket only once its results are in the op's file."""
        t = self.task["ops"][i]
        self.tuner.save_configs(t["out"])
        with open(t["done"], "a") as f:
            f.write("".join(self.pending))
            f.flush()
            os.fsync(f.fileno())
        self.pending.clear()

    def save_pending(self) -> None:
        if self.current is not None and self.pending:
            self.checkpoint(self.current)

    def build_layer(self, index: int, op: dict) -> OpLayer:
        """Built on first use. The first call outside tuning loads (or JIT-builds) the kernel
        module, timed apart from tuning. The tunes of one op share its layer (same weights, seed).
        The op asked for last is the op in hand: kernel modules loaded from now on are named after it."""
        self.op_in_hand = op["id"]
        if index not in self.layers:
            t3 = time.perf_counter()
            layer = self.layers[index] = OpLayer(op, self.device, seed=index)
            self.model.layers.append(layer)
            with autotune(False):
                layer(1)
            torch.cuda.synchronize()
            self.timing["jit"] += time.perf_counter() - t3
        return self.layers[index]

    def race(self, spec_path: str) -> None:
        self.save_pending()
        t5, jit0 = time.perf_counter(), self.timing["jit"]
        try:
            result = run_spec(spec_path, self.build_layer)
        except Exception as e:  # noqa: BLE001 - reported with the spec's name
            emit("error", op=None, bucket=None, message=f"race {os.path.basename(spec_path)} failed: "
                 f"{type(e).__name__}: {str(e)[:500]}")
            raise _Failed(3) from None
        self.timing["race"] += time.perf_counter() - t5 - (self.timing["jit"] - jit0)  # a race in context builds layers
        self.current = None  # the race cleared FlashInfer's in-memory cache
        emit("raced", spec=spec_path, seconds=time.perf_counter() - t5, errors=sum(e is not None for e in result["errors"]))

    def _layer_for(self, i: int, top: dict) -> OpLayer:
        if i != self.current:
            if self.current is not None:
                self.checkpoint(self.current)
            self.tuner.clear_cache()  # this op's file gets this op's entries only
            self.current, self.last_save = i, time.perf_counter()
        try:
            return self.build_layer(top.get("layer", i), top["op"])
        except Exception as e:  # noqa: BLE001 - reported with the op's name
            emit("error", op=top["op"]["id"], bucket=None, message=f"first call failed: {type(e).__name__}: {str(e)[:500]}")
            raise _Failed(3) from None

    def tune(self, i: int, bucket: int) -> None:
        """One (op, bucket): tuned as the engine's pass would look it up, saved at checkpoints."""
        top = self.task["ops"][i]
        op = top["op"]
        layer = self._layer_for(i, top)
        self.op_in_hand = op["id"]
        emit("start", op=op["id"], bucket=bucket)
        before = set(self.tuner.profiling_cache) if self.recorder else None
        if self.recorder:
            self.recorder.reset()
        t4 = time.perf_counter()
        try:
            with autotune(True, tuning_buckets=(bucket,)), lm_head_stub():
                self.model(lambda o, target=layer.op: 1 if o is target else None, lm_tokens=1)
            torch.cuda.synchronize()
        except torch.OutOfMemoryError as e:
            emit("error", op=op["id"], bucket=bucket, message=f"out of GPU memory: {str(e).splitlines()[0][:300]}")
            raise _Failed(3) from None
        except Exception as e:  # noqa: BLE001
            emit("error", op=op["id"], bucket=bucket, message=f"{type(e).__name__}: {str(e)[:500]}")
            raise _Failed(3) from None
        dt = time.perf_counter() - t4
        self.timing["tune"] += dt
        new = [k for k in self.tuner.profiling_cache if k not in before] if self.recorder else None
        self.pending.append(done_line(bucket, self.recorder.slots(new, self.tuner.profiling_cache) if self.recorder else None))
        if time.perf_counter() - self.last_save >= CHECKPOINT_S:
            self.checkpoint(i)
            self.last_save = time.perf_counter()
        emit("done", op=op["id"], bucket=bucket, profiles=len(op["custom_ops"]), seconds=dt, item=f"{i} {bucket}")

    def serve(self, lines) -> None:
        """Work items, ``flush`` and ``race`` lines until stdin closes (or an empty line)."""
        for line in lines:
            line = line.strip()
            if not line:
                break
            if line == "flush":
                self.save_pending()
                emit("flushed")
            elif line.startswith("race "):
                self.race(line.split(None, 1)[1])
            else:
                self.tune(*parse_item(line))
        self.save_pending()
        emit("finished", tune_s=self.timing["tune"], jit_s=self.timing["jit"], race_s=self.timing["race"],
             peak_mem=torch.cuda.max_memory_allocated(self.device), floor_s=self.floor[0] if self.floor else None)


def _setup(task_path: str | None, t_import: float):
    """The CUDA context (created before the task exists: it costs a few hundred ms), the task and
    the model skeleton; None when there is nothing to do (exit code in the second item)."""
    t1 = time.perf_counter()
    if not torch.cuda.is_available():
        emit("error", message="no CUDA device visible to the worker")
        return None, 2
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.empty(1, device=device)
    emit("cuda", cuda_s=time.perf_counter() - t1, gpu=torch.cuda.get_device_name(device))
    if task_path is None:
        task_path = sys.stdin.readline().strip()
        if not task_path:
            return None, 0  # the parent had nothing for us
    with open(task_path) as f:
        task = json.load(f)
    sk = task["skeleton"]
    t2 = time.perf_counter()
    model = SkeletonModel([], hidden=sk["hidden"], vocab=sk["vocab"], tp=sk["tp"], dp=sk["dp"], dtype=sk["dtype"], device=device)
    torch.cuda.synchronize()
    emit("ready", import_s=t_import, setup_s=time.perf_counter() - t2)
    return Worker(task, device, model), 0


def main(task_path: str | None = None, *, served: bool = False) -> int:
    """One warm's work: the events a spawned worker sends on stdout, or one served session
    (``serve.py``: stdin and stdout are the connection then, the imports were paid before)."""
    t_import = 0.0 if served else time.perf_counter() - _T0
    emit("imported", import_s=t_import, **({"served": True} if served else {}))
    worker, code = _setup(task_path, t_import)
    if worker is None:
        return code
    try:
        worker.serve(sys.stdin)
    except _Failed as e:
        return e.code
    return 0


#: FlashInfer's methods the floor and the slot recorder wrap for one warm (``Worker``).
_WRAPPED = ("choose_one", "_profile_single_kernel")


def serve_session() -> int:
    """One served warm, started as a fresh worker would: a new AutoTuner (FlashInfer's singleton,
    with its caches, blocklist, statistics and repeat counts), the peak-memory count reset; after
    it, FlashInfer's methods unwrapped and every layer and tensor of the session freed. Only the
    imported modules, the loaded kernels and the CUDA context are kept."""
    originals = {name: AutoTuner.__dict__[name] for name in _WRAPPED}
    AutoTuner._instance = None
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    try:
        return main(served=True)
    finally:
        for name, fn in originals.items():
            setattr(AutoTuner, name, fn)
        AutoTuner._instance = None
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    from autotune_cache.tune.workers.serve import serve_args, serve_sessions

    serving = serve_args(sys.argv[1:])
    if serving is not None:
        rc = serve_sessions(*serving, serve_session)
    else:
        rc = main(sys.argv[1] if len(sys.argv) > 1 else None)
    sys.stdout.flush()
    sys.stderr.flush()
    # Every result is on disk (fsynced) by now; skip tearing down torch and the CUDA context
    # in Python, which only delays the parent's merge.
    os._exit(rc)
