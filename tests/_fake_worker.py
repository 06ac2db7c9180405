"""Stands in for autotune_cache.worker where no GPU exists: same protocol (task path, then
"<op> <bucket>" items on stdin until it closes; JSON events on stdout; per-op FlashInfer-format
files and done files), behaviour chosen by FAKE_WORKER_MODE:

ok | oom (error event on the first item) | crash (SIGKILL on the first item) |
crash-after-N (SIGKILL after N items) | slow-on-0 (the worker on device 0 takes 1 s an item).
FAKE_LOG, when set, gets a "<device> <op> <bucket>" line per item tuned.
"""

import json
import os
import signal
import sys
import time

from autotune_cache.rankfile import cache_file_bytes

META = {"flashinfer_version": "0.7.2.post1", "gpu": os.environ.get("FAKE_GPU", "NVIDIA H200")}


def emit(event, **kw):
    print(json.dumps({"event": event, "t": time.time(), **kw}), flush=True)


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
        done_here += 1
        entries = json.load(open(t["out"])) if os.path.exists(t["out"]) else {}
        entries = {k: v for k, v in entries.items() if not k.startswith("_")}
        for op in t["op"]["custom_ops"]:
            entries[str((op, "FakeRunner", ((b, 64),), ()))] = ["FakeRunner", b % 7]
        with open(t["out"], "wb") as f:
            f.write(cache_file_bytes(META, entries))
        with open(t["done"], "a") as f:
            f.write(f"{b}\n")
        if os.environ.get("FAKE_LOG"):
            with open(os.environ["FAKE_LOG"], "a") as f:
                f.write(f"{device} {i} {b}\n")
        emit("done", op=t["op"]["id"], bucket=b, profiles=len(t["op"]["custom_ops"]), seconds=0.0)
    emit("finished", tune_s=0.01, jit_s=0.0, peak_mem=0, floor_s=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
