"""``doctor`` names the fix (issue 45): causes ranked by what would make the hit, each ending in the
command that makes it; tuning time per server, not per rank added up; one naming of vLLM's ranks;
vLLM's version from the API server's own line; a table that fits 100 columns.

The logs are written as the engines write them: each line through Python's ``logging`` with the
engine's own format string (tests/oracle/engine_logs.py's ``Log``), vLLM's multi-line messages
joined as its ``NewLineFormatter`` joins them (vllm/logging_utils/formatter.py: each ``\\n`` becomes
``\\r\\n`` and the record's prefix), tqdm bars from tqdm's own ``format_meter``."""

from __future__ import annotations

import json
import logging
import re
import shlex
from pathlib import Path

import pytest

from autotune_cache.plan.entry_key import KeyFields
from autotune_cache.plan.topology import Topology
from devtools.synthetic import write_fake_entry
from tests.oracle.engine_logs import ARGS, GEMM1, QWEN, VL, VL_DATE, VROOT, Log, key, sglang_pass

from ..conftest import run_cli
from .test_doctor import doctor, sessions

TP4 = KeyFields(**{**QWEN.to_dict(), "tp": 4, "skip_ops": ()})
VHASH = "9e1c0e8a9b7d6c5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e"
VW = "kernel_warmup.py"
#: vLLM 0.33's logo (vllm/entrypoints/common/startup.py, log_version_and_model), monochrome, and
#: its plain line when the logo is off.
LOGO = ("\n       █     █     █▄   ▄█\n"
        " ▄▄ ▄█ █     █     █ ▀▄▀ █  version %s\n"
        "  █▄█▀ █     █     █     █  model   %s\n"
        "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀\n")
PLAIN = "vLLM server version %s, serving model %s"
ANSI_LOGO = LOGO.replace("▄▄ ▄█", "\x1b[93m▄▄\x1b[0m \x1b[94m▄█\x1b[0m").replace("version %s", "version \x1b[1m%s\x1b[0m")


class VllmLog(Log):
    """``Log`` with vLLM's NewLineFormatter: a message of several lines is written with the
    record's prefix before each, the lines joined by ``\\r\\n``."""

    def vllm_multiline(self, proc: str, where: str, msg: str, *args) -> None:
        file, line = where.split(":")
        rec = logging.LogRecord("x", logging.INFO, "x.py", int(line), msg, args, None)
        rec.created, rec.msecs, rec.process = self.now, 123.0, 4242
        rec.__dict__.update(vllm_process_name=proc, fileinfo=file)
        text = logging.Formatter(VL, VL_DATE).format(rec)
        prefix = text.split(rec.message)[0]
        self.buf.write(text.replace("\n", "\r\n" + prefix) + "\n")


def vllm_tp4_log(banner: str = "logo", ep: bool = True, args: bool = True) -> str:
    """vLLM 0.33, TP 4 (expert parallel), a miss: the leader names rank 0's file, the ranks tune
    in step (four bars of 54 s that name no rank) while only the leader has spoken, and
    FlashInfer saves each rank's file."""
    log = VllmLog()
    if banner == "logo":
        log.vllm_multiline("APIServer", "startup.py:38", LOGO, "0.33.0", "Qwen/Qwen3-30B-A3B")
    elif banner == "ansi":
        log.vllm_multiline("APIServer", "startup.py:38", ANSI_LOGO, "0.33.0", "Qwen/Qwen3-30B-A3B")
    elif banner == "plain":
        log.vllm("APIServer", "startup.py:38", PLAIN, "0.33.0", "Qwen/Qwen3-30B-A3B")
    if args:
        nd = {"model_tag": "Qwen/Qwen3-30B-A3B", "model": "Qwen/Qwen3-30B-A3B", "tensor_parallel_size": 4,
              "enable_expert_parallel": ep, "moe_backend": "flashinfer_cutlass"}
        log.vllm("APIServer", "startup.py:96", "non-default args: %s", nd)
    worker = [f"Worker_TP{r}" + (f"_EP{r}" if ep else "") for r in range(4)]
    path = f"{VROOT}/{VHASH}/autotune_configs_dp0_rank%d.json"
    log.vllm(worker[0], f"{VW}:496", "Using FlashInfer autotune cache file: %s. Pass "
             "--disable-flashinfer-autotune to skip autotuning.", path % 0)
    log.vllm(worker[0], f"{VW}:371", "Running FlashInfer autotune with %d tokens and token buckets %s.", 8192,
             [1, 2, 4, 8192])
    for _ in range(4):
        log.bar(GEMM1, 21, 54 / 21)
    for r in range(4):
        log.flashinfer("autotuner.py:3673", f"[Autotuner]: Saved 42 configs to {path % r} (42 new, 0 from previous "
                       "config)")
    return log.text()


# --- 1. the cause that makes the hit: a version or arch directory before any key field -------------

@pytest.fixture
def two_entries(root) -> Path:
    """Our tree: Qwen3-30B-A3B at TP 2 and at TP 4, both under FlashInfer 0.7.2.post1 / sm90."""
    write_fake_entry(root, QWEN, Topology(tp=2, pp=1, dp=1, dp_attention=False), arch="sm90")
    write_fake_entry(root, TP4, Topology(tp=4, pp=1, dp=1, dp_attention=False), arch="sm90")
    return root


def sglang_tp4_log(version: str = "0.7.2.post1", arch: str = "sm90") -> str:
    log = Log()
    log.sglang("", ARGS.format(tp=4, ep=1))
    sglang_pass(log, key(TP4), [f" TP{i}" for i in range(4)], tune=True)
    return log.text().replace("0.7.2.post1/sm90", f"{version}/{arch}")


def test_a_new_flashinfer_version_is_the_cause_not_a_key_field(tmp_path, two_entries):
    """The server runs FlashInfer 0.8.0; its key (TP 4) is ours under 0.7.2.post1. The TP 2 entry,
    changed in tp, also hashes to that key: the version is named, not tp."""
    log = tmp_path / "boot.log"
    log.write_text(sglang_tp4_log(version="0.8.0"))
    report = doctor(str(log), "--cache-dir", str(two_entries), code=1)
    for s in sessions(report):
        assert s["cause_kind"] == "no-entry"
        assert (f"the nearest entry, 0.7.2.post1/sm90/{key(TP4)}, differs in FlashInfer version "
                "(0.7.2.post1 there, 0.8.0 for this server)") in s["cause"], s["cause"]
        assert "tp:" not in s["cause"]


def test_another_arch_is_the_cause_not_a_key_field(tmp_path, two_entries):
    log = tmp_path / "boot.log"
    log.write_text(sglang_tp4_log(arch="sm100"))
    (s, *_) = sessions(doctor(str(log), "--cache-dir", str(two_entries), code=1))
    assert "differs in arch (sm90 there, sm100 for this server)" in s["cause"] and "tp:" not in s["cause"]


def test_a_key_field_is_still_named_where_no_directory_holds_the_key(tmp_path, root):
    write_fake_entry(root, QWEN, Topology(tp=2, pp=1, dp=1, dp_attention=False), arch="sm90")
    log = tmp_path / "boot.log"
    log.write_text(sglang_tp4_log(version="0.8.0"))
    (s, *_) = sessions(doctor(str(log), "--cache-dir", str(root), code=1))
    assert "differs in tp: 2 there, 4 here" in s["cause"]


# --- 3. tuning time per server -------------------------------------------------------------------

@pytest.mark.parametrize("args", [True, False])
def test_vllm_ranks_tuning_in_step_count_once(tmp_path, args):
    """Four ranks' bars of 54 s, read while only the leader had spoken: the server tuned about
    54 s (216 s before: every rank's bar added up), whether or not its args state TP 4."""
    log = tmp_path / "vllm.log"
    log.write_text(vllm_tp4_log(args=args))
    report = doctor(str(log), "--cache-dir", str(tmp_path), code=1)
    (server,) = report["servers"]
    assert server["tuning_seconds"] == 54, server["tuning_seconds"]
    assert all(s["tuning_seconds"] <= 54 for s in sessions(report))


def test_sglang_time_is_still_one_pass_of_each_op(tmp_path, two_entries):
    log = tmp_path / "boot.log"
    log.write_text(sglang_tp4_log(version="0.8.0"))
    (server,) = doctor(str(log), "--cache-dir", str(two_entries), code=1)["servers"]
    assert server["tuning_seconds"] == 27 + 18


# --- 4. vLLM: one naming of ranks, the version from the API server's line -----------------------

@pytest.mark.parametrize("ep", [True, False])
def test_vllm_ranks_are_named_as_vllm_names_its_workers(tmp_path, ep):
    log = tmp_path / "vllm.log"
    log.write_text(vllm_tp4_log(ep=ep))
    (server,) = doctor(str(log), "--cache-dir", str(tmp_path), code=1)["servers"]
    assert [r["rank"] for r in server["ranks"]] == [f"Worker_TP{r}" + (f"_EP{r}" if ep else "") for r in range(4)]


@pytest.mark.parametrize("banner", ["logo", "ansi", "plain"])
def test_vllm_version_from_the_api_servers_banner(tmp_path, banner):
    log = tmp_path / "vllm.log"
    log.write_text(vllm_tp4_log(banner=banner))
    assert b"\r\n" in log.read_bytes() or banner == "plain"
    (server,) = doctor(str(log), "--cache-dir", str(tmp_path), code=1)["servers"]
    assert server["version"] == "0.33.0"


def test_a_line_ending_in_carriage_return_is_read(tmp_path):
    """NewLineFormatter ends every line of a multi-line message in "\\r": such a line is read."""
    log = tmp_path / "vllm.log"
    log.write_text(vllm_tp4_log(banner="plain").replace("non-default args", "non-default args", 1)
                   .replace("Qwen/Qwen3-30B-A3B\n", "Qwen/Qwen3-30B-A3B\r\n", 1))
    (server,) = doctor(str(log), "--cache-dir", str(tmp_path), code=1)["servers"]
    assert server["version"] == "0.33.0"


# --- 2. each cause ends with the command that fixes it -------------------------------------------

def test_the_fix_is_warm_with_the_servers_own_flags_and_plans_its_key(tmp_path, two_entries):
    """The command rebuilt from ``server_args`` is the serving command SGLang was given: planned,
    it names the very key the server looked for."""
    log = tmp_path / "boot.log"
    log.write_text(sglang_tp4_log(version="0.8.0"))
    (cause,) = doctor(str(log), "--cache-dir", str(two_entries), code=1)["servers"][0]["causes"]
    fix = cause["fix"]
    assert fix["command"].startswith("fi-autotune warm -- python -m sglang.launch_server --model-path "
                                     "Qwen/Qwen3-30B-A3B") and "--tp-size 4" in fix["command"]
    assert fix["where"] == "in the serving image, with FlashInfer 0.8.0"
    serving = fix["command"].split(" -- ", 1)[1].split()
    proc = run_cli("plan", "--json", "--arch", "sm90", "--", *serving)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["workers"][0]["id"].endswith(key(TP4))


def test_the_fix_is_pull_from_a_store_when_one_is_named(tmp_path, two_entries):
    log = tmp_path / "boot.log"
    log.write_text(sglang_tp4_log(version="0.8.0"))
    (cause,) = doctor(str(log), "--cache-dir", str(two_entries), "--store", "s3://b/c", code=1)["servers"][0]["causes"]
    assert cause["fix"]["command"] == f"fi-autotune pull s3://b/c 0.8.0/sm90/{key(TP4)} --cache-dir /root/.cache/sglang"
    assert "fi-autotune warm --push s3://b/c -- python -m sglang.launch_server" in cause["fix"]["where"]


def test_a_diverged_drop_is_fixed_by_importing_ours_whole(root):
    write_fake_entry(root, QWEN, Topology(tp=2, pp=1, dp=1, dp_attention=False), arch="sm90")
    logs = Path(__file__).resolve().parents[1] / "data" / "engine_logs"
    (cause,) = doctor(str(logs / "sglang-diverged.log"), "--cache-dir", str(root), code=1)["servers"][0]["causes"]
    assert cause["fix"]["command"] == (f"fi-autotune export 0.7.2.post1/sm90/{key(QWEN)} --cache-dir {root} "
                                       "-o entry.tar.gz && "
                                       "fi-autotune import entry.tar.gz --cache-dir /root/.cache/sglang --force")
    # the export half runs as pasted, wherever it is pasted: it names the tree doctor read
    export = shlex.split(cause["fix"]["command"].split(" && ")[0])[1:]
    export[export.index("entry.tar.gz")] = str(root.parent / "entry.tar.gz")
    assert run_cli(*export).returncode == 0 and (root.parent / "entry.tar.gz").stat().st_size > 0


def test_the_vllm_fix_names_its_config_hash_and_its_flags(tmp_path):
    (tmp_path / "flashinfer_autotune_cache").mkdir()
    log = tmp_path / "vllm.log"
    log.write_text(vllm_tp4_log())
    (cause,) = doctor(str(log), "--cache-dir", str(tmp_path), code=1)["servers"][0]["causes"]
    assert cause["fix"]["command"] == (
        f"fi-autotune warm --vllm-config-hash {VHASH} -- vllm serve Qwen/Qwen3-30B-A3B --tensor-parallel-size 4 "
        "--enable-expert-parallel --moe-backend flashinfer_cutlass")


# --- 5. the human view fits 100 columns -----------------------------------------------------------

def test_the_human_view_fits_100_columns_and_ends_in_the_fix(tmp_path, two_entries):
    logs = Path(__file__).resolve().parents[1] / "data" / "engine_logs"
    (tmp_path / "v.log").write_text(vllm_tp4_log())
    (tmp_path / "s.log").write_text(sglang_tp4_log(version="0.8.0"))
    for log in [*sorted(logs.glob("*.log")), tmp_path / "v.log", tmp_path / "s.log"]:
        proc = run_cli("doctor", str(log), "--cache-dir", str(two_entries))
        lines = proc.stdout.splitlines()
        # a path alone on its line (the tree doctor read, named in a fix) is the one thing not broken
        fits = [len(line) <= 100 or len(line.removesuffix(" \\").split()) == 1 for line in lines[1:]]
        assert all(fits), (log.name, max(map(len, lines[1:])))
    assert re.search(r"fix \(in the serving image, with FlashInfer 0\.8\.0\):\n +fi-autotune warm -- python -m "
                     r"sglang\.launch_server", proc.stdout)
    verbose = run_cli("doctor", str(tmp_path / "v.log"), "--cache-dir", str(two_entries), "-v").stdout
    assert VHASH in verbose.split("\n  tuned:")[0]  # -v: the whole id in the table
