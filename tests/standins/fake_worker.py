"""Stands in for autotune_cache.tune.workers.worker where no GPU exists: same protocol (task path, then
"<op> <bucket>" items on stdin until it closes; JSON events on stdout; per-op FlashInfer-format
files and done files), behaviour chosen by FAKE_WORKER_MODE:

ok | oom (error event on the first item) | crash (SIGKILL on the first item) |
crash-after-N (SIGKILL after N items) | slow-on-0 (the worker on device 0 takes 1 s an item).
FAKE_LOG, when set, gets a "<device> <op> <bucket>" line per item tuned. The keys written are
the ones the op's recipe predicts (what ``check`` and ``verify`` look for); FAKE_ITEM_SLEEP
(seconds) slows every item down.

Careful mode (the task's ``record_slots``): each tune of an op picks tactic ``(bucket + tune) % 3``
when FAKE_TUNES=disagree (else ``bucket % 7`` for every tune); with FAKE_TUNES=two-runners the
second tune stores its winner under another runner's key (same slot), as FlashInfer does when
another runner wins. ``race <spec>`` times FlashInfer's default at 1.0 ms and the i-th candidate
at 1 / (1 + FAKE_RACE_GAIN) * (1 + 0.01 i) ms; FAKE_RACE_LOG gets one line per race;
FAKE_RACE_CRASH_AFTER=N kills the worker at its (N+1)-th race; FAKE_PAIR_FASTEST=i makes the
i-th candidate of every pair-round race (``careful.plan_pair_races``) the fastest, at 0.5 ms;
FAKE_PAIR_UNREADABLE=1 writes a pair-round result that is not JSON. FAKE_SERVE_START=kill (or
exit-N) makes a served worker die before it listens or logs a line: SIGKILL (exit status N).
"""

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

from autotune_cache.autotuner.rankfile import cache_file_bytes, parse_file_key

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: devtools from the repo
from devtools.fingerprint import DEFAULT_METADATA  # noqa: E402

META = {**DEFAULT_METADATA, "gpu": os.environ.get("FAKE_GPU", "NVIDIA H200")}


def keys_of(op, bucket):
    """The keys FlashInfer would store for this op at this bucket: what the plan's recipe
    predicts (``check`` and ``verify`` look for exactly these)."""
    from autotune_cache.autotuner.recipe import OpRecipe

    return OpRecipe.from_dict(op).file_keys(bucket)


def emit(event, **kw):
    print(json.dumps({"event": event, "t": time.time(), **kw}), flush=True)


RACES = [0]


def race(spec_path):
    crash_after = os.environ.get("FAKE_RACE_CRASH_AFTER")
    if crash_after is not None and RACES[0] == int(crash_after):
        os.kill(os.getpid(), signal.SIGKILL)
    RACES[0] += 1
    spec = json.load(open(spec_path))
    gain = float(os.environ.get("FAKE_RACE_GAIN", "0.10"))
    medians = []
    for i, values in enumerate(spec["assignments"]):
        default = all(v[1] == -1 for v in values.values())
        medians.append(1.0 if default else 1.0 / (1 + gain) * (1 + 0.01 * i))
    if ".pair." in spec_path and os.environ.get("FAKE_PAIR_FASTEST"):
        medians[int(os.environ["FAKE_PAIR_FASTEST"])] = 0.5
    if ".pair." in spec_path and os.environ.get("FAKE_PAIR_UNREADABLE"):
        Path(spec["result"]).write_text("{")
        emit("raced", spec=spec_path, seconds=0.0, errors=0)
        return
    with open(spec["result"], "w") as f:
        json.dump({"bucket": spec["bucket"], "medians_ms": medians, "relative_iqr": [0.01] * len(medians),
                   "runs": [spec["settings"]["rounds"]] * len(medians), "errors": [None] * len(medians),
                   "graph": spec["settings"]["graph"], "cold_l2": spec["settings"]["cold_l2"]}, f)
    if os.environ.get("FAKE_RACE_LOG"):
        with open(os.environ["FAKE_RACE_LOG"], "a") as f:
            f.write(json.dumps({"bucket": spec["bucket"], "n": len(medians), "graph": spec["settings"]["graph"],
                                "span": spec["settings"].get("span"),
                                "context": [n["op"]["id"] for n in spec["context"]] if "context" in spec else None})
                    + "\n")
    emit("raced", spec=spec_path, seconds=0.0, errors=0)


def main():
    mode = os.environ.get("FAKE_WORKER_MODE", "ok")
    device = os.environ.get("CUDA_VISIBLE_DEVICES", "?")
    emit("imported", import_s=0.01)
    emit("cuda", cuda_s=0.01, gpu=META["gpu"])
    path = sys.stdin.readline().strip()
    if not path:
        return 0
    task = json.load(open(path))
    emit("ready", import_s=0.01, setup_s=0.01)
    done_here = 0
    for line in sys.stdin:
        line = line.strip()
        if line == "flush":
            emit("flushed")
            continue
        if line.startswith("race "):
            race(line.split(None, 1)[1])
            continue
        i, b = map(int, line.split())
        t = task["ops"][i]
        emit("start", op=t["op"]["id"], bucket=b)
        if mode == "oom":
            emit("error", op=t["op"]["id"], bucket=b, message="out of GPU memory: tried to allocate 80 GiB")
            return 3
        if mode == "crash" or (mode.startswith("crash-after-") and done_here == int(mode.rsplit("-", 1)[1])):
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "slow-on-0" and device == "0":
            time.sleep(1.0)
        time.sleep(float(os.environ.get("FAKE_ITEM_SLEEP", "0")))
        done_here += 1
        entries = json.load(open(t["out"])) if os.path.exists(t["out"]) else {}
        entries = {k: v for k, v in entries.items() if not k.startswith("_")}
        m = re.search(r"\.r(\d+)\.w", t["out"])
        tune = int(m[1]) if m else 0
        tunes = os.environ.get("FAKE_TUNES", "agree")
        slots = []
        slots = []
        for slot in keys_of(t["op"], b):
            parsed = parse_file_key(slot)
            key, runner = slot, parsed.runner
            if tunes == "two-runners" and tune == 1:
                key, runner = slot.replace(repr(parsed.runner), "'OtherRunner'", 1), "OtherRunner"
            tactic = (b + tune) % 3 if tunes in ("disagree", "two-runners") else b % 7
            entries[key] = [runner, tactic, ["l2_cache_policy", "hot"]]
            slots.append({"slot": slot, "key": key, "default_runner": parsed.runner})
        tmp = f"{t['out']}.{os.getpid()}.tmp"  # as FlashInfer saves: a temp file, then a rename
        with open(tmp, "wb") as f:  # (a worker stopped mid-write must not leave a truncated file)
            f.write(cache_file_bytes(META, entries))
        os.replace(tmp, t["out"])
        with open(t["done"], "a") as f:
            f.write(f"{b} {json.dumps(slots)}\n" if task.get("record_slots") else f"{b}\n")
        if os.environ.get("FAKE_LOG"):
            with open(os.environ["FAKE_LOG"], "a") as f:
                f.write(f"{device} {i} {b}\n")
        emit("done", op=t["op"]["id"], bucket=b, profiles=len(t["op"]["custom_ops"]), seconds=0.0, item=f"{i} {b}")
    emit("finished", tune_s=0.01, jit_s=0.0, race_s=0.01 if task.get("record_slots") else 0.0, peak_mem=0, floor_s=None)
    return 0


if __name__ == "__main__":
    from autotune_cache.tune.workers.serve import serve_args, serve_sessions

    serving = serve_args(sys.argv[1:])  # `fi-autotune workers start`: served, as the real worker is
    death = os.environ.get("FAKE_SERVE_START") if serving else None
    if death == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if death:
        sys.exit(int(death.removeprefix("exit-")))
    sys.exit(serve_sessions(*serving, main) if serving else main())
