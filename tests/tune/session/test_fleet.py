"""Fleets: targets files, plan/warm/check --targets, sharding - with real processes and real trees.

No GPU exists here: ``warm`` runs through tests/standins/fake_gpu_cli.py, the real command line on a
machine of two H200s whose workers run tests/standins/fake_worker.py (it writes the keys the plan's
recipes predict, with an H200 fingerprint). Everything else - planning, the work queue, the
commits, the stores, the shard split - is the real thing.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import jsonschema
import pytest

from autotune_cache.errors import UsageError
from autotune_cache.plan.targets import MAX_TARGETS, assign, load_targets, parse_shard, parse_targets, shard_from_env

from tests.support.fake_gpus import FAKE_GPU_CLI, gpu_env, run_gpu_cli
from tests.conftest import REPO, imported_packages, run_cli

TARGETS = """\
defaults:
  arch: sm90
targets:
  - model: nvidia/Llama-3.1-70B-Instruct-FP8
    tp: [4, 8]
  - name: qwen3-moe
    model: Qwen/Qwen3-30B-A3B
    tp: 2
    moe_runner_backend: flashinfer_cutlass
    layouts: [sglang, flashinfer-v2]
  - name: qwen3-moe-image
    model: Qwen/Qwen3-30B-A3B
    model_path: /models/Qwen3-30B-A3B
    tp: 2
    moe-runner-backend: flashinfer_cutlass
  - model: Qwen/Qwen3-30B-A3B
    tp: 4
    dp: 4
    moe_runner_backend: flashinfer_cutlass
"""
NAMES = ["Llama-3.1-70B-Instruct-FP8-tp4", "Llama-3.1-70B-Instruct-FP8-tp8", "qwen3-moe", "qwen3-moe-image", "Qwen3-30B-A3B"]


@pytest.fixture
def fleet(tmp_path):
    f = tmp_path / "targets.yaml"
    f.write_text(TARGETS)
    return f


# -- the file ----------------------------------------------------------------------------------

def test_matrix_defaults_names_and_list_fields():
    ts = parse_targets({"defaults": {"arch": "sm90", "moe-runner-backend": "flashinfer_cutlass"},
                        "targets": [{"model": "org/m", "tp": [4, 8], "ep": [1, 8], "skip_ops": ["a", "b"]},
                                    {"model": "org/m", "layouts": [["sglang"], ["sglang", "flashinfer-v2"]]},
                                    {"model": "org/m"}, {"model": "org/m", "arch": "sm100"}]}, "t.yaml")
    assert [t.name for t in ts] == ["m-tp4-ep1", "m-tp4-ep8", "m-tp8-ep1", "m-tp8-ep8",
                                    "m-layouts=['sglang']", "m-layouts=['sglang', 'flashinfer-v2']", "m", "m#2"]
    assert ts[0].fields == {"arch": "sm90", "moe_runner_backend": "flashinfer_cutlass", "model": "org/m", "tp": 4, "ep": 1,
                            "skip_ops": ["a", "b"]}  # a plain list of skip_ops is one value
    assert ts[3].source == "t.yaml: targets[0] (tp=8, ep=8)" and ts[-1].fields["arch"] == "sm100"
    assert len(parse_targets([{"model": "org/m"}], "t")) == 1  # a bare list is the targets list


@pytest.mark.parametrize("data,message", [
    ({"targets": []}, "non-empty list"),
    ({"targets": [{"model": "m", "tp": []}]}, "t.yaml: targets[0]: field 'tp' is an empty list"),
    ({"targets": [{"model": "m", "skip_ops": [[["x"]]]}]}, "targets[0]: field 'skip_ops': a list of names"),
    ({"targets": [{"model": "m", "skip_ops": ["a", {"b": 1}]}]}, "targets[0]: field 'skip_ops': a list of names"),
    ({"target": [{"model": "m"}]}, "unknown top-level key"),
    ({"targets": ["m"]}, "expected a mapping"),
    ("just text", "expected a list of targets"),
    ({"targets": [{"model": "m", "tp": list(range(1, 101)), "ep": list(range(1, 101)), "pp": [1, 2]}]}, f"past {MAX_TARGETS}"),
])
def test_bad_files(data, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        parse_targets(data, "t.yaml")


def test_a_yaml_alias_bomb_is_refused_quickly_not_expanded(tmp_path):
    """470 bytes whose aliases repeat each other 9 times over 8 levels (a "billion laughs") took
    minutes of CPU and gigabytes; a file's values are counted, each alias where it is used, and
    the count stops at the cap."""
    levels = ['x0: &l0 ["x","x","x","x","x","x","x","x","x"]']
    levels += [f"x{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    (tmp_path / "bomb.yaml").write_text("\n".join(levels) + "\ntargets:\n  - {model: org/m, skip_ops: *l8}\n")
    with pytest.raises(UsageError, match="expands to more than .* values"):
        load_targets(tmp_path / "bomb.yaml")


@pytest.mark.parametrize("name,text", [
    ("t.yaml", "targets:\n  - model: org/m\n    tp: 4\n    tp: 8\n"),
    ("t.json", '{"targets": [{"model": "org/m", "tp": 4, "tp": 8}]}'),
])
def test_a_key_given_twice_in_a_target_is_refused_not_the_last_taken(tmp_path, name, text):
    """``tp: 4`` then ``tp: 8``: the parsers keep the last, and a slip warmed another topology."""
    (tmp_path / name).write_text(text)
    with pytest.raises(UsageError, match="the key 'tp' is given twice"):
        load_targets(tmp_path / name)


def test_a_yaml_merge_key_still_takes_its_defaults(tmp_path):
    """``<<: *defaults`` then a key of them again is YAML's override, not a key given twice."""
    (tmp_path / "t.yaml").write_text("defaults: &b {model: org/m, tp: 4}\ntargets:\n  - {<<: *b, tp: 8}\n")
    (t,) = load_targets(tmp_path / "t.yaml")
    assert t.fields == {"model": "org/m", "tp": 8}


def test_load_yaml_json_and_relative_config(tmp_path):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "t.yaml").write_text("targets:\n  - {model: org/m, config: cfg/config.json, tp: 2}\n")
    (t,) = load_targets(tmp_path / "t.yaml")
    assert t.fields["config"] == str(tmp_path.resolve() / "cfg" / "config.json")
    (tmp_path / "t.json").write_text(json.dumps([{"model": "org/m"}]))
    assert load_targets(tmp_path / "t.json")[0].name == "m"
    (tmp_path / "bad.yaml").write_text("targets: [ {model: m\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        load_targets(tmp_path / "bad.yaml")
    with pytest.raises(UsageError, match="cannot read targets file"):
        load_targets(tmp_path / "missing.yaml")


# -- shards ------------------------------------------------------------------------------------

def test_shard_sources():
    assert parse_shard("1/4").index == 1
    for bad in ("4/4", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(UsageError):
            parse_shard(bad)
    k8s = shard_from_env({"JOB_COMPLETION_INDEX": "2", "JOB_COMPLETIONS": "3", "RANK": "0", "WORLD_SIZE": "8"})
    assert (k8s.index, k8s.count) == (2, 3) and "Kubernetes" in k8s.source  # before torchrun's
    slurm = shard_from_env({"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "4", "SLURM_ARRAY_TASK_COUNT": "2"})
    assert (slurm.index, slurm.count) == (1, 2)
    assert shard_from_env({"RANK": "3", "WORLD_SIZE": "4"}).index == 3
    assert shard_from_env({}) is None
    with pytest.raises(UsageError, match="not in 0..1"):
        shard_from_env({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "2"})
    with pytest.raises(UsageError, match="not a number"):
        shard_from_env({"RANK": "x", "WORLD_SIZE": "2"})


def test_assign_is_balanced_and_deterministic():
    weights = [84, 84, 42, 42, 42, 10, 300]
    a = assign(weights, 3)
    assert a == assign(list(weights), 3) and sorted(set(a)) == [0, 1, 2]
    loads = [sum(w for w, s in zip(weights, a) if s == k) for k in range(3)]
    assert sorted(loads) == [136, 168, 300]  # longest first, each to the least loaded


def test_plan_shards_partition_the_list(fleet, tmp_path):
    full = json.loads(run_cli("plan", "--targets", str(fleet), "--json").stdout)
    assert [t["target"] for t in full["workers"]] == NAMES
    parts = [json.loads(run_cli("plan", "--targets", str(fleet), "--shard", f"{i}/3", "--json").stdout) for i in range(3)]
    names = [t["target"] for p in parts for t in p["workers"]]
    assert sorted(names) == sorted(NAMES) and len(names) == len(set(names))


# -- plan / check ------------------------------------------------------------------------------

def test_plan_targets_merges_identical_calls_and_shows_coverage(fleet, tmp_path):
    root = tmp_path / "root"
    proc = run_cli("plan", "--targets", str(fleet), "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == ("5 entries to tune: 294 profiles one by one, 252 once identical calls "
                                            "are merged (10 distinct calls, 14% less)")
    data = json.loads(run_cli("plan", "--targets", str(fleet), "--cache-dir", str(root), "--json").stdout)
    assert {t["coverage"] for t in data["workers"]} == {"missing"}
    assert data["profiles_one_by_one"] == 294 and data["profiles_merged"] == 252
    from devtools.synthetic import entry_path, write_plan_entry
    from autotune_cache.plan.request import TuneRequest

    plan = TuneRequest.from_dict(data["workers"][2]["request"]).plan(root)
    write_plan_entry(plan)
    partial = TuneRequest.from_dict(data["workers"][0]["request"]).plan(root)
    eid = write_plan_entry(partial)
    next(entry_path(root, eid).glob("rank_*.json")).unlink()
    data = json.loads(run_cli("plan", "--targets", str(fleet), "--cache-dir", str(root), "--json").stdout)
    assert [t["coverage"] for t in data["workers"]][:3] == ["partly (incomplete, 3/4 rank files)", "missing", "covered"]


def test_targets_usage_errors(fleet, tmp_path):
    proc = run_cli("plan", "--targets", str(fleet), "--tp", "2")
    assert proc.returncode == 2 and "--tp: with --targets" in proc.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("targets:\n  - {model: org/m, tpp: 2}\n")
    proc = run_cli("plan", "--targets", str(bad), "--arch", "sm90")
    assert proc.returncode == 2 and "targets[0]: unknown field 'tpp' (known:" in proc.stderr
    bad.write_text("targets:\n  - {model: Qwen/Qwen3-30B-A3B, tp: two}\n")
    proc = run_cli("plan", "--targets", str(bad), "--arch", "sm90")
    assert proc.returncode == 2 and "targets[0]" in proc.stderr and "two" in proc.stderr
    bad.write_text("targets:\n  - {model: Qwen/Qwen3-30B-A3B, layouts: [sglang, vllm]}\n")
    proc = run_cli("plan", "--targets", str(bad), "--arch", "sm90")
    assert proc.returncode == 2 and "one engine per target" in proc.stderr
    proc = run_cli("plan", "--model", "Qwen/Qwen3-30B-A3B", "--arch", "sm90", "--shard", "0/2")
    assert proc.returncode == 2 and "--shard and --store go with --targets" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- warm --targets ------------------------------------------------------------------------------

def warm_targets(fleet: Path, tmp_path: Path, *args, env: dict | None = None, xdg: str = "xdg") -> subprocess.CompletedProcess:
    return run_gpu_cli("warm", "--targets", str(fleet), "--cache-dir", str(tmp_path / "root"), *args,
                   env=gpu_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / xdg), **(env or {})))


def test_warm_targets_tunes_identical_calls_once_and_writes_what_warm_alone_writes(fleet, tmp_path):
    log = tmp_path / "items.log"
    proc = warm_targets(fleet, tmp_path, "--json", "--push", f"file://{tmp_path / 'store'}", env={"FAKE_LOG": str(log)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert [t["status"] for t in data["workers"]] == ["written"] * 5
    assert (data["profiles_total"], data["profiles_distinct"], data["profiles_tuned"]) == (294, 252, 252)
    items = log.read_text().splitlines()
    assert len(items) == len({tuple(x.split()[1:]) for x in items}) == 210  # every (call, bucket) once, not 231
    assert sorted(data["pushed"]) == sorted(NAMES) and "qwen3-moe" in data["converted"]
    for line in ("written qwen3-moe", "written Llama-3.1-70B-Instruct-FP8-tp4"):
        assert line in proc.stderr
    # the same target warmed alone (same stand-in measurements): the same rank files, byte for byte
    alone = run_gpu_cli("warm", "--model", "Qwen/Qwen3-30B-A3B", "--model-path", "/models/Qwen3-30B-A3B", "--tp", "2",
                    "--moe-runner-backend", "flashinfer_cutlass", "--cache-dir", str(tmp_path / "alone"), "--json",
                    env=gpu_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "xdg-alone")))
    assert alone.returncode == 0, alone.stderr[-2000:]
    a = json.loads(alone.stdout)
    fleet_dir = Path(next(t["key_dir"] for t in data["workers"] if t["name"] == "qwen3-moe-image"))
    for f in a["rank_files"]:
        assert Path(f).read_bytes() == (fleet_dir / Path(f).name).read_bytes()
    check = run_cli("check", "--targets", str(fleet), "--cache-dir", str(tmp_path / "root"), "--strict")
    assert check.returncode == 0 and check.stdout.splitlines()[-1] == "5 of 5 targets covered", check.stdout
    again = warm_targets(fleet, tmp_path, "--json")
    assert [t["status"] for t in json.loads(again.stdout)["workers"]] == ["complete"] * 5


def test_a_target_is_written_while_the_rest_still_tunes(fleet, tmp_path):
    log = tmp_path / "items.log"
    proc = warm_targets(fleet, tmp_path, "--json", "--deal", "targets",
                        env={"FAKE_LOG": str(log), "FAKE_ITEM_SLEEP": "0.02"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    first = json.loads(proc.stdout)["workers"][0]
    written_at = (Path(first["key_dir"]) / "fi-autotune.manifest.json").stat().st_mtime
    assert written_at < log.stat().st_mtime - 0.5  # the last item came well after the first commit


def test_the_fleet_deals_its_costliest_work_first_and_writes_the_same_files(fleet, tmp_path):
    log = tmp_path / "items.log"
    proc = warm_targets(fleet, tmp_path, "--json", "--gpus", "1", "--deal", "longest", env={"FAKE_LOG": str(log)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    items = [tuple(map(int, line.split()[1:])) for line in log.read_text().splitlines()]
    assert len(items) == len(set(items)) == 210
    buckets = [b for _, b in items]
    assert buckets[0] == max(buckets) and buckets[-1] == min(buckets)  # longest first, across every target
    # the other order tunes the same calls into the same files, byte for byte
    other = tmp_path / "other"
    other.mkdir()
    again = warm_targets(fleet, other, "--json", "--gpus", "1", "--deal", "targets")
    assert again.returncode == 0, again.stderr[-2000:]
    by_name = {t["name"]: Path(t["key_dir"]) for t in json.loads(again.stdout)["workers"]}
    for t in json.loads(proc.stdout)["workers"]:
        mine = Path(t["key_dir"])
        for f in sorted(mine.glob("rank_*.json")):
            assert f.read_bytes() == (by_name[t["name"]] / f.name).read_bytes()


def test_longest_first_orders_by_cost_across_targets():
    from types import SimpleNamespace
    from autotune_cache.tune.session.fleetrun import FleetRun
    ops = [{"custom_ops": ["gemm"], "buckets": [1, 8192]}, {"custom_ops": ["gemm1", "gemm2"], "buckets": [1, 4096]}]
    items = [SimpleNamespace(needs={0: {1, 8192}}), SimpleNamespace(needs={1: {1, 4096}})]
    run = FleetRun(items, ops, [Path("a"), Path("b")], [set(), set()], False, 1, None, "longest")
    # two custom ops at 4096 tokens cost more than one at 8192; the small buckets fill the end
    assert run.queue() == [(1, 4096), (0, 8192), (1, 1), (0, 1)]
    run = FleetRun(items, ops, [Path("a"), Path("b")], [set(), {4096}], False, 1, None, "targets")
    assert run.queue() == [(0, 8192), (0, 1), (1, 1)]  # target by target; what was saved is not dealt again
    with pytest.raises(ValueError):
        FleetRun(items, ops, [], [set(), set()], False, 1, None, "shortest")


def test_careful_tuning_is_one_target_in_its_own_work_dir():
    """A careful run races and selects per call in one target's work dir (``warm`` of one
    target); a shared per-call dir holds other targets' buckets, so the run refuses it."""
    from types import SimpleNamespace
    from autotune_cache.tune.session.fleetrun import FleetRun
    from autotune_cache.tune.careful.quality import QualitySettings
    ops = [{"custom_ops": ["gemm"], "buckets": [1, 8192]}]
    one = [SimpleNamespace(needs={0: {1, 8192}})]
    careful = QualitySettings("careful")
    with pytest.raises(ValueError, match="careful"):
        FleetRun(one, ops, [Path("a")], None, False, 1, None, quality=careful)
    with pytest.raises(ValueError, match="careful"):
        FleetRun(one * 2, ops, [Path("a")], None, False, 1, None, quality=careful, shared=False)
    run = FleetRun(one, ops, [Path("a")], [set()] * careful.tunes, False, 1, None, quality=careful, shared=False)
    assert run.tunes == [(0, r) for r in range(careful.tunes)] and run.prefix(0, 1) == "op0.r1"


def test_a_failed_run_keeps_what_it_wrote_and_resumes(fleet, tmp_path):
    proc = warm_targets(fleet, tmp_path, "--gpus", "1", "--deal", "targets", "--json",
                        env={"FAKE_WORKER_MODE": "crash-after-100"})
    assert proc.returncode == 1 and "stopped (killed by SIGKILL)" in proc.stderr
    assert re.search(r"\d of 5 targets were written before it", proc.stderr), proc.stderr
    written = int(re.search(r"(\d) of 5 targets were written", proc.stderr)[1])
    assert written >= 1
    # --json says it too: every target with its status, and why the warm stopped
    stopped = json.loads(proc.stdout)
    jsonschema.validate(stopped, json.loads((REPO / "docs" / "schemas" / "warm.schema.json").read_text()))
    assert sum(t["status"] == "written" for t in stopped["workers"]) == written and len(stopped["workers"]) == 5
    assert "killed by SIGKILL" in stopped["stopped"] and stopped["interrupted"] is False
    again = warm_targets(fleet, tmp_path, "--json")
    data = json.loads(again.stdout)
    assert again.returncode == 0 and sum(t["status"] == "written" for t in data["workers"]) == 5 - written
    assert data["profiles_tuned"] < data["profiles_distinct"]  # the saved buckets were not tuned again


def test_indexed_job_shards_meet_in_one_store(fleet, tmp_path):
    """Two 'pods' at once (own machines: own work dirs and trees), sharded by the variables an
    Indexed Job sets; together they cover every target in the store."""
    store = f"file://{tmp_path / 'store'}"
    procs = [subprocess.Popen(
        [*FAKE_GPU_CLI, "warm", "--targets", str(fleet), "--cache-dir", str(tmp_path / f"pod{i}"),
         "--push", store, "--json"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**__import__("os").environ, **gpu_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / f"xdg{i}")),
             "JOB_COMPLETION_INDEX": str(i), "JOB_COMPLETIONS": "2"}) for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    mine = [{t["name"] for t in json.loads(o)["workers"]} for o, _ in outs]
    assert mine[0] and mine[1] and not mine[0] & mine[1] and mine[0] | mine[1] == set(NAMES)
    assert all("Kubernetes Indexed Job" in e for _, e in outs)
    check = run_cli("check", "--targets", str(fleet), "--store", store, "--strict")
    assert check.returncode == 0, check.stdout


def test_check_targets_strict_fails_on_a_missing_target(fleet, tmp_path):
    proc = run_cli("check", "--targets", str(fleet), "--cache-dir", str(tmp_path / "empty"), "--strict", "--json")
    data = json.loads(proc.stdout)
    assert proc.returncode == 1 and data["missing"] == 5 and data["covered"] == 0


def test_the_documented_example_plans(tmp_path):
    """docs/fleet.md's targets file, as written, through `plan --targets` (CPU)."""
    doc = (REPO / "docs" / "fleet.md").read_text()
    block = re.search(r"```yaml\n(# targets.yaml\n.*?)```", doc, re.S)[1]
    (tmp_path / "targets.yaml").write_text(block)
    proc = run_cli("plan", "--targets", str(tmp_path / "targets.yaml"), "--cache-dir", str(tmp_path / "root"), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert len(data["workers"]) == 5 and data["profiles_merged"] < data["profiles_one_by_one"]
    assert f"plans 5 targets as {data['profiles_one_by_one']} profiles one by one and {data['profiles_merged']} merged" in doc


def test_a_target_gets_only_its_own_buckets_of_a_shared_call(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("defaults: {model: nvidia/Llama-3.1-70B-Instruct-FP8, tp: 4}\n"
                 "targets:\n  - {name: all}\n  - {name: small, model_path: /models/l, max_tokens: 256}\n")
    proc = warm_targets(f, tmp_path, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    small_profiles = next(t["profiles"] for t in data["workers"] if t["name"] == "small")
    assert small_profiles < 84 and data["profiles_distinct"] == 84 and data["profiles_total"] == 84 + small_profiles
    small = Path(next(t["key_dir"] for t in data["workers"] if t["name"] == "small"))
    keys = [k for k in json.loads(next(small.glob("rank_*.json")).read_text()) if not k.startswith("_")]
    assert len(keys) == small_profiles  # its own buckets of the shared calls, not all 84
    f.write_text("targets:\n  - {model: nvidia/Llama-3.1-70B-Instruct-FP8, tp: 4, arch: sm90}\n"
                 "  - {model: nvidia/Llama-3.1-70B-Instruct-FP8, tp: 4, arch: sm90, max_tokens: 64}\n")
    proc = run_cli("plan", "--targets", str(f))
    assert proc.returncode == 2 and "are one entry" in proc.stderr


def test_warm_push_for_one_target(tmp_path):
    args = ["warm", "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass",
            "--cache-dir", str(tmp_path / "root")]
    bad = run_gpu_cli(*args, "--push", str(tmp_path / "not-a-url"), env=gpu_env(tmp_path))
    assert bad.returncode == 2 and "give a store URL" in bad.stderr
    store = f"file://{tmp_path / 'store'}"
    proc = run_gpu_cli(*args, "--push", store, "--json", env=gpu_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["status"] == "written" and data["push"]["pushed"]
    listed = json.loads(run_cli("ls", store, "--json").stdout)
    assert [e["id"] for e in listed["entries"]] == ["/".join(Path(data["key_dir"]).parts[-3:])]


@pytest.mark.parametrize("targets", [True, False], ids=["warm-targets", "warm"])
def test_ctrl_c_is_one_line_exit_130_and_a_rerun_resumes(fleet, tmp_path, targets):
    """SIGINT mid-tuning: exit 130, one line that is not an error (everything finished is
    kept), no traceback; the rerun tunes only what was left."""
    import signal
    import time

    log = tmp_path / "items.log"
    env = gpu_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "xdg"), FAKE_LOG=str(log), FAKE_ITEM_SLEEP="0.3")
    args = (["--targets", str(fleet)] if targets else
            ["--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass"])
    cmd = [*FAKE_GPU_CLI, "warm", *args, "--cache-dir", str(tmp_path / "root")]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (log.exists() and log.read_text().count("\n") >= 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    lines = [x for x in err.splitlines() if "interrupted" in x]  # (the rest is the progress line)
    assert len(lines) == 1 and lines[0].startswith("fi-autotune: interrupted: ") and err.rstrip().endswith(lines[0]), err
    assert "error" not in err
    assert "Traceback" not in err
    done_before = log.read_text().count("\n")
    again = run_gpu_cli("warm", *args, "--cache-dir", str(tmp_path / "root"), env={k: v for k, v in env.items() if k != "FAKE_ITEM_SLEEP"})
    assert again.returncode == 0, again.stderr[-2000:]
    assert log.read_text().count("\n") - done_before < (252 if targets else 42)  # resumed, not tuned from scratch


def test_verify_on_a_host_without_a_gpu_says_so_not_pass_arch(fleet, tmp_path):
    """An entry warm wrote knows its arch: on a GPU-less host verify names the missing GPU (the
    real problem), with or without --arch, instead of asking for an --arch it already has; and
    says so from NVML, before importing torch for a replay it cannot run."""
    warm = run_gpu_cli("warm", "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend",
                       "flashinfer_cutlass", "--cache-dir", str(tmp_path / "root"), "--json",
                       env=gpu_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "xdg")))
    assert warm.returncode == 0, warm.stderr[-2000:]
    key_dir = Path(json.loads(warm.stdout)["key_dir"])
    eid = f"{key_dir.parent.parent.name}/{key_dir.parent.name}/{key_dir.name}"
    for extra in ([], ["--arch", "sm90"]):
        proc = run_cli("verify", eid, *extra, "--cache-dir", str(tmp_path / "root"),
                       env={"PYTHONPROFILEIMPORTTIME": "1", "CUDA_VISIBLE_DEVICES": ""})  # GPU-less on a GPU host too
        assert proc.returncode == 2 and "no CUDA GPU found" in proc.stderr, proc.stderr
        assert "pass --arch" not in proc.stderr
        imported = imported_packages(proc.stderr)
        assert "click" in imported and "torch" not in imported
