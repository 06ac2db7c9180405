"""Stands in for autotune_cache.worker where no GPU exists: same protocol (task path on stdin,
JSON events on stdout, per-op FlashInfer-format files), behaviour chosen by FAKE_WORKER_MODE."""

import json
import os
import signal
import sys

from autotune_cache.rankfile import cache_file_bytes

META = {"flashinfer_version": "0.7.2.post1", "gpu": os.environ.get("FAKE_GPU", "NVIDIA H200")}


def emit(event, **kw):
    print(json.dumps({"event": event, **kw}), flush=True)


def main():
    mode = os.environ.get("FAKE_WORKER_MODE", "ok")
    emit("imported", import_s=0.01)
    path = sys.stdin.readline().strip()
    if not path:
        return 0
    task = json.load(open(path))
    emit("ready", import_s=0.01, setup_s=0.01, gpu=META["gpu"])
    emit("jit", jit_s=0.0)
    done_here = 0
    for t in task["ops"]:
        entries = json.load(open(t["out"])) if os.path.exists(t["out"]) else {}
        entries = {k: v for k, v in entries.items() if not k.startswith("_")}
        for b in t["buckets"]:
            emit("start", op=t["op"]["id"], bucket=b)
            if mode == "oom":
                emit("error", op=t["op"]["id"], bucket=b, message="out of GPU memory: tried to allocate 80 GiB")
                return 3
            if mode == "crash" or (mode.startswith("crash-after-") and done_here == int(mode.rsplit("-", 1)[1])):
                os.kill(os.getpid(), signal.SIGKILL)
            done_here += 1
            for op in t["op"]["custom_ops"]:
                entries[str((op, "FakeRunner", ((b, 64),), ()))] = ["FakeRunner", b % 7]
            with open(t["out"], "wb") as f:
                f.write(cache_file_bytes(META, entries))
            with open(t["done"], "a") as f:
                f.write(f"{b}\n")
            emit("done", op=t["op"]["id"], bucket=b, profiles=len(t["op"]["custom_ops"]), seconds=0.0)
    emit("finished", tune_s=0.01, peak_mem=0, floor_s=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
