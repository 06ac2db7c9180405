"""Write the startup-log fixtures of ``doctor`` (tests/logs/test_doctor.py) in tests/data/engine_logs/.

    .venv/bin/python tests/oracle/engine_logs.py

How each line is made (what is the engines' own, and what is replayed):
- line prefixes: Python ``logging`` with each engine's own formatter string and date format
  (SGLang ``[%(asctime)s{prefix}] %(message)s``, common.py:2630; vLLM ``(%(vllm_process_name)s
  pid=%(process)d) %(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s``, logger.py:28;
  FlashInfer ``%(asctime)s - %(levelname)s - %(filename)s:%(lineno)d - flashinfer.jit: %(message)s``,
  jit/core.py:68), the record's time, file and line set to the engine's call site;
- messages: the format strings of FORMATS.md, filled in (``logger.info(fmt, *args)`` as the
  engine calls it);
- tqdm bars: tqdm's own ``format_meter`` with FlashInfer's arguments (autotuner.py:2400-2406:
  desc ``[AutoTuner]: Tuning {op}``, unit ``profile``), its redraws ``\\r``-separated as tqdm
  writes them to a pipe;
- paths: SGLang's key from fi-autotune's key schema (held to SGLang's own function by
  tests/engines/test_sglang_oracle.py), so the hit fixtures name entries ``devtools/synthetic`` writes.
Not yet done: running SGLang's ``flashinfer_autotune_context`` itself on the CPU oracle
(tests/oracle/) to emit these lines; the GPU test (tests/logs/test_doctor_gpu.py) reads a log of
FlashInfer's own autotuner on a lent GPU.
"""

from __future__ import annotations

import io
import logging
import sys
import time
from pathlib import Path

import tqdm

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "tests" / "data" / "engine_logs"  # where the fixtures live (next to FORMATS.md)
sys.path.insert(0, str(REPO))

from autotune_cache.plan.entry_key import KeyFields, get_schema  # noqa: E402

T0 = time.mktime((2026, 6, 29, 1, 38, 0, 0, 0, -1))
SG = "[%(asctime)s{prefix}] %(message)s"
SG_DATE = "%Y-%m-%d %H:%M:%S"
VL = "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"
VL_DATE = "%m-%d %H:%M:%S"
FI = "%(asctime)s - %(levelname)s - %(filename)s:%(lineno)d - flashinfer.jit: %(message)s"
ROOT = "/root/.cache/sglang/flashinfer/autotune/0.7.2.post1/sm90"
VROOT = "/root/.cache/vllm/flashinfer_autotune_cache/0.7.2.post1/90a"
VHASH = "3f1c0e8a9b7d6c5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e"
QWEN = KeyFields("Qwen/Qwen3-30B-A3B", "bfloat16", None, "flashinfer_cutlass", 2, 1, 1, 1, "Qwen3MoeConfig")
ARGS = "server_args={{'model_path': 'Qwen/Qwen3-30B-A3B', 'tp_size': {tp}, 'pp_size': 1, 'ep_size': {ep}, " \
       "'quantization': None, 'moe_runner_backend': 'flashinfer_cutlass', 'dtype': 'auto'}}"


def key(f: KeyFields) -> str:
    return get_schema("sglang").key(f)


class Log:
    """One log being written: records at a clock that only the script advances."""

    def __init__(self) -> None:
        self.buf = io.StringIO()
        self.now = T0

    def _emit(self, fmt: str, datefmt: str | None, msg: str, args=(), level=logging.INFO, **extra) -> None:
        rec = logging.LogRecord("x", level, extra.pop("pathname", "x.py"), extra.pop("lineno", 1), msg, args, None)
        rec.created, rec.msecs = self.now, 123.0
        rec.process = extra.pop("pid", 4242)
        rec.__dict__.update(extra)
        self.buf.write(logging.Formatter(fmt, datefmt).format(rec) + "\n")

    def sglang(self, prefix: str, msg: str, *args) -> None:
        self._emit(SG.replace("{prefix}", prefix), SG_DATE, msg, args)

    def vllm(self, proc: str, where: str, msg: str, *args) -> None:
        file, line = where.split(":")
        self._emit(VL, VL_DATE, msg, args, vllm_process_name=proc, fileinfo=file, lineno=int(line))

    def flashinfer(self, where: str, msg: str, level=logging.INFO) -> None:
        file, line = where.split(":")
        self._emit(FI, None, msg, level=level, pathname=file, lineno=int(line))

    def bar(self, op: str, total: int, per: float, stop: int | None = None) -> None:
        """tqdm's redraws of one bar as a pipe gets them: ``\\r`` + each state, a newline at close."""
        desc = f"[AutoTuner]: Tuning {op}"
        end = total if stop is None else stop
        for n in range(0, end + 1, max(1, total // 4)) if end else [0]:
            self.buf.write("\r" + tqdm.tqdm.format_meter(n, total, n * per, prefix=desc, unit="profile"))
        if end and end % max(1, total // 4):
            self.buf.write("\r" + tqdm.tqdm.format_meter(end, total, end * per, prefix=desc, unit="profile"))
        if stop is None:
            self.buf.write("\n")
        self.now += end * per

    def tick(self, s: float) -> None:
        self.now += s

    def text(self) -> str:
        return self.buf.getvalue()


RUN = "Running FlashInfer autotune with cache: %s"
DONE = "FlashInfer autotune completed."
DROP = ("FlashInfer autotune: per-rank caches disagree, discarding them and tuning from scratch so all ranks agree "
        "on the tactics.")
GEMM1, GEMM2 = "trtllm::fused_moe::gemm1", "trtllm::fused_moe::gemm2"


def sglang_pass(log: Log, k: str, ranks: list[str], tune: bool, drop: bool = False, files=None, end=True) -> None:
    files = files or [f"rank_tp{i}_pp0_dp0.json" for i in range(len(ranks))]
    if drop:
        log.sglang(ranks[0], DROP)
    for r, f in zip(ranks, files):
        log.sglang(r, RUN, f"{ROOT}/{k}/{f}")
    log.tick(2)
    if tune:
        for _ in ranks:
            log.bar(GEMM1, 21, 1.3)
        for _ in ranks:
            log.bar(GEMM2, 21, 0.9)
    log.tick(1)
    if end:
        for r in ranks:
            log.sglang(r, DONE)


def fixtures() -> dict[str, str]:
    out = {}
    tp2 = [" TP0", " TP1"]
    log = Log(); log.sglang("", ARGS.format(tp=2, ep=1)); sglang_pass(log, key(QWEN), tp2, tune=False)
    out["sglang-hit.log"] = log.text()
    other = KeyFields(**{**QWEN.to_dict(), "tp": 4, "skip_ops": ()})
    log = Log(); log.sglang("", ARGS.format(tp=4, ep=1))
    sglang_pass(log, key(other), [f" TP{i}" for i in range(4)], tune=True)
    out["sglang-miss-other-tp.log"] = log.text()
    log = Log(); sglang_pass(log, key(QWEN), tp2, tune=True, drop=True)
    out["sglang-diverged.log"] = log.text()
    ep = KeyFields(**{**QWEN.to_dict(), "ep": 2})
    log = Log(); log.sglang("", ARGS.format(tp=2, ep=2)); sglang_pass(log, key(ep), [" TP0 EP0", " TP1 EP1"], tune=True, drop=True)
    out["sglang-ep2-diverged.log"] = log.text()
    draft = KeyFields(**{**QWEN.to_dict(), "is_draft": True, "draft_quantization": None})
    log = Log(); sglang_pass(log, key(QWEN), tp2, tune=False); sglang_pass(log, key(draft), tp2, tune=True)
    out["sglang-spec-draft-missing.log"] = log.text()
    log = Log()
    ranks8 = [f" TP{i}" for i in range(8)]
    k8 = key(KeyFields(**{**QWEN.to_dict(), "tp": 8}))
    sglang_pass(log, k8, ranks8, tune=True)
    out["sglang-8ranks-interleaved.log"] = _interleave(log.text())
    log = Log(); sglang_pass(log, key(QWEN), [""], tune=False, end=False)
    log.buf.write("\r" + tqdm.tqdm.format_meter(7, 21, 9.1, prefix=f"[AutoTuner]: Tuning {GEMM1}", unit="profile"))
    out["sglang-truncated.log"] = log.text()
    out.update(vllm_fixtures())
    return out


def _interleave(text: str) -> str:
    """``kubectl logs --prefix --timestamps`` of one pod: each line behind the pod's prefix."""
    lines = text.splitlines(keepends=True)
    return "".join(f"[pod/qwen-tp8-0/sglang] 2026-06-29T01:38:{i % 60:02d}.000000000Z {line}" for i, line in enumerate(lines))


VW = "kernel_warmup.py"


def vllm_fixtures() -> dict[str, str]:
    out = {}
    path0 = f"{VROOT}/{VHASH}/autotune_configs_dp0_rank0.json"
    for name, hit in (("vllm-tp2-hit.log", True), ("vllm-tp2-miss.log", False)):
        log = Log()
        log.vllm("EngineCore_DP0", "core.py:140", "Initializing a V1 LLM engine (v%s) with config: %s", "0.33.0", "...")
        log.vllm("Worker_TP0", f"{VW}:496", "Using FlashInfer autotune cache file: %s. Pass "
                 "--disable-flashinfer-autotune to skip autotuning.", path0)
        if hit:
            for r in range(2):
                log.flashinfer("autotuner.py:3814", f"[Autotuner]: Loaded 42 configs from {VROOT}/{VHASH}/autotune_configs_dp0_rank{r}.json")
        else:
            for r in range(2):
                log.vllm(f"Worker_TP{r}", f"{VW}:371", "Running FlashInfer autotune with %d tokens and token buckets %s.",
                         8192, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 8192])
            log.flashinfer("autotuner.py:1048", "[Autotuner]: Autotuning process starts ...")
            for _ in range(2):
                log.bar(GEMM1, 21, 1.1)
            log.flashinfer("autotuner.py:1071", "[Autotuner]: Autotuning process ends")
        out[name] = log.text()
    env = "0123456789abcdef"
    for name, hit in (("vllm-single-managed-hit.log", True), ("vllm-single-managed-miss.log", False)):
        log = Log()
        log.vllm("EngineCore_DP0", "core.py:140", "Initializing a V1 LLM engine (v%s) with config: %s", "0.33.0", "...")
        log.vllm("EngineCore_DP0", f"{VW}:485", "Using FlashInfer managed autotune cache (root=%s). Pass "
                 "--disable-flashinfer-autotune to skip autotuning.", "flashinfer default")
        log.flashinfer("autotune_cache.py:495", "[Autotuner]: Managed autotune cache attached for this process: "
                       f"ManagedAutotuneCache(env_dir='/root/.cache/flashinfer/autotune/v2/{env}', hits=0, misses=0)")
        log.flashinfer("autotuner.py:1048", "[Autotuner]: Autotuning process starts ...")
        if hit:
            log.flashinfer("autotune_cache.py:528", "[Autotuner]: Preloaded 42/42 managed cache entries into memory")
            log.flashinfer("autotuner.py:2019", f"[Autotuner]: Config cache hit for {GEMM1} (runner=CutlassFusedMoERunner, source=managed cache)")
        else:
            log.vllm("EngineCore_DP0", f"{VW}:371", "Running FlashInfer autotune with %d tokens and token buckets %s.", 8192, [1, 2, 4, 8192])
            log.bar(GEMM1, 21, 1.2)
        log.flashinfer("autotuner.py:1071", "[Autotuner]: Autotuning process ends")
        out[name] = log.text()
    return out


def main() -> None:
    for name, text in fixtures().items():
        (HERE / name).write_text(text)
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()
