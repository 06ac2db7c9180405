"""A fleet checks what its targets check: `check --targets --strict` reports, worker by worker,
the misses each target's own `check --strict` reports (a speculative target's draft worker, a
single-GPU vLLM target, a plain one), and one target's error names it while the others run."""

from __future__ import annotations

import json
from pathlib import Path

from autotune_cache.plan.request import TuneRequest
from devtools.synthetic import DEFAULT_METADATA, write_plan_entry

from ..conftest import run_cli

QWEN = "Qwen/Qwen3-30B-A3B"
SPEC = {"model": "zai-org/GLM-5.1", "tp": 8, "moe_runner_backend": "flashinfer_cutlass",
        "speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4}
VLLM1 = {"model": QWEN, "tp": 1, "moe_runner_backend": "flashinfer_cutlass", "layouts": ["vllm"]}
PLAIN = {"model": QWEN, "tp": 2, "moe_runner_backend": "flashinfer_cutlass"}
TARGETS = {"spec": SPEC, "vllm1": VLLM1, "plain": PLAIN}


def _flags(fields: dict) -> list[str]:
    out = []
    for k, v in fields.items():
        if k == "layouts":
            out += ["--layout", ",".join(v)]
        else:
            out += [f"--{k.replace('_', '-')}", str(v)]
    return out


def _setup(tmp_path: Path) -> tuple[Path, Path, dict]:
    targets = tmp_path / "targets.yaml"
    body = {"defaults": {"arch": "sm90", "flashinfer_version": "0.7.2.post1"},
            "targets": [{"name": n, **f} for n, f in TARGETS.items()]}
    targets.write_text(json.dumps(body))
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"fingerprint": DEFAULT_METADATA, "arch": "sm90"}))
    root = tmp_path / "sglang"
    root.mkdir()
    return targets, env, {"VLLM_CACHE_ROOT": str(tmp_path / "vllm"), "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": ""}


def _fleet_check(targets, root, env, vllm_env, *extra):
    proc = run_cli("check", "--targets", str(targets), "--cache-dir", str(root), "--env-from", str(env), "--strict",
                   "--json", *extra, env=vllm_env)
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def _single_check(name, root, env, vllm_env):
    """The target's own check, as its user runs it, with the fleet's --cache-dir: it applies to
    every target, vLLM's included (issue 45)."""
    proc = run_cli("check", *_flags(TARGETS[name]), "--arch", "sm90", "--flashinfer-version", "0.7.2.post1",
                   "--cache-dir", str(root), "--env-from", str(env), "--strict", "--json", env=vllm_env)
    return proc.returncode, json.loads(proc.stdout)


def _misses(workers) -> dict:
    return {w["worker"]: (w["entry"], sorted(w["misses"])) for w in workers}


def _assert_fleet_is_its_targets(targets, root, env, vllm_env) -> dict:
    code, fleet, err = _fleet_check(targets, root, env, vllm_env)
    assert not fleet["errors"], err
    by_target: dict = {}
    for w in fleet["workers"]:
        by_target.setdefault(w["target"], []).append(w)
    assert set(by_target) == set(TARGETS)
    assert [w["worker"] for w in by_target["spec"]] == ["target", "draft"]  # the draft is planned and checked
    singles = {}
    for name in TARGETS:
        single_code, single = _single_check(name, root, env, vllm_env)
        assert _misses(by_target[name]) == _misses(single["workers"]), name
        singles[name] = single_code
    assert code == (1 if any(singles.values()) else 0)
    return fleet


def test_check_targets_strict_reports_each_targets_own_misses(tmp_path):
    targets, env, vllm_env = _setup(tmp_path)
    root = tmp_path / "sglang"
    fleet = _assert_fleet_is_its_targets(targets, root, env, vllm_env)  # nothing there: every worker misses
    assert fleet["covered"] == 0 and fleet["missing"] == 3 and not fleet["ok"]
    plan = run_cli("plan", "--targets", str(targets), "--cache-dir", str(root), "--json", env=vllm_env)
    workers = json.loads(plan.stdout)["workers"]
    assert [(w["target"], w["worker"]) for w in workers] == [("spec", "target"), ("spec", "draft"),
                                                               ("vllm1", "target"), ("plain", "target")]
    spec_target, spec_draft = (TuneRequest.from_dict(w["request"]).plan(root) for w in workers[:2])
    assert spec_draft.entry_id != spec_target.entry_id
    # the target's entry and the plain target's: the draft worker still misses, in both reports
    write_plan_entry(spec_target)
    write_plan_entry(TuneRequest.from_dict(workers[3]["request"]).plan(root))
    fleet = _assert_fleet_is_its_targets(targets, root, env, vllm_env)
    draft = next(w for w in fleet["workers"] if w["worker"] == "draft")
    assert not draft["ok"] and not draft["found"]
    human = run_cli("check", "--targets", str(targets), "--cache-dir", str(root), "--env-from", str(env), "--strict",
                    env=vllm_env)
    assert human.returncode == 1 and "MISS: spec draft: " in human.stdout
    assert "1 of 3 targets covered" in human.stdout
    write_plan_entry(spec_draft)
    fleet = _assert_fleet_is_its_targets(targets, root, env, vllm_env)
    assert fleet["covered"] == 2  # the vLLM store is still empty


def test_one_targets_error_names_it_and_the_others_still_run(tmp_path):
    targets, env, vllm_env = _setup(tmp_path)
    root = tmp_path / "sglang"
    # without --env-from the single-GPU vLLM target cannot be checked (its store's directory is
    # named by the serving environment): that target's error, the others' verdicts
    proc = run_cli("check", "--targets", str(targets), "--cache-dir", str(root), "--strict", "--json", env=vllm_env)
    data = json.loads(proc.stdout)
    assert proc.returncode == 2, proc.stderr
    assert [e["target"] for e in data["errors"]] == ["vllm1"] and "targets[1]" in data["errors"][0]["target_source"]
    assert "targets[1]" in proc.stderr and "--env-from" in proc.stderr
    assert {w["target"] for w in data["workers"]} == {"spec", "plain"}
    bad = json.loads(targets.read_text())
    bad["targets"][2]["tpp"] = 2
    targets.write_text(json.dumps(bad))
    for cmd in (["plan"], ["check", "--env-from", str(env)]):
        proc = run_cli(*cmd, "--targets", str(targets), "--cache-dir", str(root), "--json", env=vllm_env)
        data = json.loads(proc.stdout)
        assert proc.returncode == 2 and "targets[2]" in proc.stderr and "unknown field 'tpp'" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert [e["target"] for e in data["errors"]] == ["plain"]
        assert {w["target"] for w in data["workers"]} == {"spec", "vllm1"}


def test_warm_targets_tunes_the_good_targets_and_names_the_bad_one(tmp_path):
    from tests.support.fake_gpus import gpu_env, run_gpu_cli

    targets = tmp_path / "t.yaml"
    targets.write_text(json.dumps({"defaults": {"flashinfer_version": "0.7.2.post1"}, "targets": [
        {"name": "good", **PLAIN}, {"name": "bad", "model": QWEN, "tpp": 1}]}))
    proc = run_gpu_cli("warm", "--targets", str(targets), "--cache-dir", str(tmp_path / "root"), "--json",
                       env=gpu_env(tmp_path))
    assert proc.returncode == 2, proc.stderr
    data = json.loads(proc.stdout)
    assert [(w["target"], w["status"]) for w in data["workers"]] == [("good", "written")]
    # --json names the bad target too, as plan --targets --json does
    assert [(e["target"], e["target_source"]) for e in data["errors"]] == [("bad", "t.yaml: targets[1]")]
    assert "unknown field 'tpp'" in data["errors"][0]["error"]
    assert proc.stderr.count("targets[1]") == 2 and "unknown field 'tpp'" in proc.stderr  # before tuning, and last
    assert proc.stderr.strip().splitlines()[-1].endswith("not tuned, their fields are wrong: t.yaml: targets[1]")
