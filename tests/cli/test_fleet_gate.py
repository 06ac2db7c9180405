"""Issue 45: a fleet gate is the sum of its targets, for every layout. ``--cache-dir`` and
``--env-from`` apply to every target (vLLM's included, as in its own ``check``); targets that are
one entry (two single-GPU vLLM targets in one managed-store entry) are checked and reported under
each name; a target that cannot be checked is named in ``errors`` while the others are checked,
and ``--json`` always prints. The real CLI, real trees (warmed on stand-in GPUs)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from devtools.synthetic import DEFAULT_METADATA

from ..conftest import REPO, run_cli
from ..support.fake_gpus import gpu_env, run_gpu_cli

QWEN = "Qwen/Qwen3-30B-A3B"
HASH = "7a11" * 16
VLLM1 = {"model": QWEN, "tp": 1, "moe_runner_backend": "flashinfer_cutlass", "layouts": ["vllm"]}
TARGETS = {
    "v1": VLLM1,
    "v1-again": VLLM1,  # another name for the same single-GPU vLLM: one managed-store entry
    "v2": {"model": QWEN, "tp": 2, "moe_runner_backend": "flashinfer_cutlass", "layouts": ["vllm"],
           "vllm_config_hash": HASH},
    "plain": {"model": QWEN, "tp": 2, "moe_runner_backend": "flashinfer_cutlass"},
}


def _flags(fields: dict) -> list[str]:
    out = []
    for k, v in fields.items():
        out += ["--layout", ",".join(v)] if k == "layouts" else [f"--{k.replace('_', '-')}", str(v)]
    return out


def _setup(tmp_path: Path, names=tuple(TARGETS), extra: list | None = None):
    targets = tmp_path / "targets.yaml"
    targets.write_text(json.dumps({"defaults": {"arch": "sm90", "flashinfer_version": "0.7.2.post1"},
                                   "targets": [{"name": n, **TARGETS[n]} for n in names] + (extra or [])}))
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"fingerprint": {**DEFAULT_METADATA, "gpu": "NVIDIA H200"}, "arch": "sm90"}))
    root = tmp_path / "cache"
    root.mkdir(exist_ok=True)
    # vLLM's own roots point elsewhere: a target that ignored --cache-dir would read them
    return targets, env, root, gpu_env(tmp_path, VLLM_CACHE_ROOT=str(tmp_path / "vllm-root"),
                                       VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR="")


def _valid(stdout: str) -> dict:
    data = json.loads(stdout)
    jsonschema.validate(data, json.loads((REPO / "docs/schemas/check.schema.json").read_text()))
    return data


def _fleet(targets, root, env, vars_, *extra):
    proc = run_cli("check", "--targets", str(targets), "--cache-dir", str(root), *extra, "--strict", "--json",
                   env=vars_)
    return proc.returncode, _valid(proc.stdout), proc.stderr


def _own_check(name, root, env, vars_):
    proc = run_cli("check", *_flags(TARGETS[name]), "--arch", "sm90", "--flashinfer-version", "0.7.2.post1",
                   "--cache-dir", str(root), "--env-from", str(env), "--strict", "--json", env=vars_)
    return proc.returncode, _valid(proc.stdout)["workers"]


def _by_target(workers) -> dict:
    return {w["target"]: w for w in workers}


def test_two_single_gpu_vllm_targets_in_one_entry_are_each_checked_and_named(tmp_path):
    """The issue's fleet: it used to exit 2 "... are one entry", check nothing (the SGLang target
    included) and print no JSON. Now every target is checked where its own check looks, under
    --cache-dir, and the shared entry is named."""
    targets, env, root, vars_ = _setup(tmp_path)
    code, fleet, err = _fleet(targets, root, env, vars_, "--env-from", str(env))
    assert code == 1, err  # --strict: every target misses
    assert fleet["errors"] == [] and fleet["targets"] == 4 and fleet["missing"] == 4
    by = _by_target(fleet["workers"])
    assert set(by) == set(TARGETS)
    assert by["v1"]["entry"] == by["v1-again"]["entry"] and by["v1"]["entry"].startswith("flashinfer-v2:")
    assert by["v1"]["same_entry_as"] == ["v1-again"] and by["v1-again"]["same_entry_as"] == ["v1"]
    assert by["plain"]["same_entry_as"] == [] and by["v2"]["same_entry_as"] == []
    for name, w in by.items():  # --cache-dir applies to every target, vLLM's too
        assert Path(w["where"]).is_relative_to(root), (name, w["where"])
        own_code, (own,) = _own_check(name, root, env, vars_)
        assert (w["entry"], w["where"], sorted(w["misses"])) == (own["entry"], own["where"], sorted(own["misses"]))
        assert own_code == 1
    human = run_cli("check", "--targets", str(targets), "--cache-dir", str(root), "--env-from", str(env),
                    "--strict", env=vars_)
    assert human.returncode == 1 and "0 of 4 targets covered" in human.stdout, human.stdout + human.stderr
    assert f"one entry, {by['v1']['entry']}: v1, v1-again" in human.stderr


def test_what_warm_targets_writes_under_cache_dir_is_what_the_gate_checks(tmp_path):
    """warm --targets --cache-dir writes every target there (vLLM's too); check --targets with
    the same --cache-dir finds each, and the two names of one entry are both covered."""
    targets, env, root, vars_ = _setup(tmp_path)
    to_warm = tmp_path / "warm.yaml"
    body = json.loads(targets.read_text())
    body["targets"] = [t for t in body["targets"] if t["name"] != "v1-again"]  # one entry is tuned once
    to_warm.write_text(json.dumps(body))
    proc = run_gpu_cli("warm", "--targets", str(to_warm), "--cache-dir", str(root), "--json", env=vars_)
    assert proc.returncode == 0, proc.stderr
    written = {w["name"]: Path(w["key_dir"]) for w in json.loads(proc.stdout)["workers"]}
    assert all(p.is_relative_to(root) for p in written.values()), written
    assert not (tmp_path / "vllm-root").exists()
    code, fleet, err = _fleet(targets, root, env, vars_, "--env-from", str(env))
    assert code == 0 and fleet["ok"] and fleet["covered"] == 4, (fleet, err)
    by = _by_target(fleet["workers"])
    assert by["v1"]["ok"] and by["v1-again"]["ok"] and by["v1-again"]["keys_checked"] == by["v1"]["keys_checked"] > 0
    for name in TARGETS:
        assert _own_check(name, root, env, vars_)[0] == 0, name


def test_an_unusable_target_is_named_while_the_rest_are_checked_and_json_prints(tmp_path):
    """A target whose fields are wrong, beside two that are one entry: the wrong one is in
    ``errors`` (exit 2, after the others ran), every other target has its verdict."""
    targets, env, root, vars_ = _setup(tmp_path, extra=[{"name": "bad", "model": QWEN, "tpp": 2}])
    code, fleet, err = _fleet(targets, root, env, vars_, "--env-from", str(env))
    assert code == 2 and "unknown field 'tpp'" in err
    assert [e["target"] for e in fleet["errors"]] == ["bad"]
    assert set(_by_target(fleet["workers"])) == set(TARGETS) and fleet["targets"] == 5
    # without --env-from the managed store's directory cannot be named: both of its targets are
    # errors, named; the rest are still checked
    code, fleet, err = _fleet(targets, root, env, vars_)
    assert code == 2
    assert sorted(e["target"] for e in fleet["errors"]) == ["bad", "v1", "v1-again"]
    assert set(_by_target(fleet["workers"])) == {"v2", "plain"}
    assert "--env-from" in err
