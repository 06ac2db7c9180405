"""Every command's ``--json`` is one versioned envelope, held to its schema (docs/schemas/):
with and without speculative decoding, with and without targets, dry runs and real runs."""

from __future__ import annotations

import json

import jsonschema
import pytest

from fi_autotune_cli.main import COMMANDS
from fi_autotune_cli.output import JSON_FORMATS, json_format
from tests.support.fake_gpus import gpu_env, run_gpu_cli
from devtools.synthetic import DEFAULT_METADATA, default_fields, write_fake_entry

from ..conftest import REPO, run_cli

SCHEMAS = REPO / "docs" / "schemas"
QWEN = ["--model", "Qwen/Qwen3-30B-A3B", "--moe-runner-backend", "flashinfer_cutlass", "--arch", "sm90",
        "--flashinfer-version", "0.7.2.post1"]
EAGLE = ["--model", "zai-org/GLM-5.1", "--tp", "8", "--moe-runner-backend", "flashinfer_cutlass", "--arch", "sm90",
         "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4"]


def schema(command: str) -> dict:
    return json.loads((SCHEMAS / f"{command}.schema.json").read_text())


def valid(command: str, proc, codes=(0,)) -> dict:
    """The output of one run, checked: its exit status, one JSON object, its envelope, its schema."""
    assert proc.returncode in codes, proc.stderr
    data = json.loads(proc.stdout)
    assert data["format"] == json_format(command) and list(data)[0] == "format"
    jsonschema.validate(data, schema(command))
    return data


def test_every_command_has_a_format_and_a_schema():
    assert set(JSON_FORMATS) == set(COMMANDS)
    assert {p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json")} == set(COMMANDS)
    for command in COMMANDS:
        jsonschema.Draft202012Validator.check_schema(schema(command))
        assert schema(command).get("properties", {}).get("format", {"const": json_format(command)}) == \
            {"const": json_format(command)}


@pytest.fixture
def world(tmp_path):
    root = tmp_path / "root"
    a = write_fake_entry(root)
    b = write_fake_entry(root, fields=default_fields(model="m2"), seed=2, with_manifest=False)
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"fingerprint": DEFAULT_METADATA, "arch": "sm90"}))
    targets = tmp_path / "targets.yaml"
    targets.write_text(json.dumps({"defaults": {"arch": "sm90", "flashinfer_version": "0.7.2.post1"}, "targets": [
        {"name": "spec", "model": "zai-org/GLM-5.1", "tp": 8, "moe_runner_backend": "flashinfer_cutlass",
         "speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
         "speculative_num_draft_tokens": 4},
        {"name": "plain", "model": "Qwen/Qwen3-30B-A3B", "tp": 2, "moe_runner_backend": "flashinfer_cutlass"}]}))
    return {"root": root, "a": str(a), "b": str(b), "env": str(env), "targets": str(targets), "tmp": tmp_path}


def test_plan_and_check_list_workers_alike(world):
    cd = ["--cache-dir", str(world["root"])]
    one = valid("plan", run_cli("plan", *QWEN, "--tp", "2", "--json", *cd))
    store = valid("plan", run_cli("plan", *QWEN, "--tp", "1", "--layout", "vllm", "--json", *cd))
    assert store["workers"][0]["id"] is None and store["workers"][0]["writes"] == "store_entries"
    two = valid("plan", run_cli("plan", *EAGLE, "--json", *cd))
    fleet = valid("plan", run_cli("plan", "--targets", world["targets"], "--json", *cd))
    assert [w["worker"] for w in one["workers"]] == ["target"]
    assert [w["worker"] for w in two["workers"]] == ["target", "draft"]
    assert [(w["target"], w["worker"]) for w in fleet["workers"]] == [("spec", "target"), ("spec", "draft"),
                                                                        ("plain", "target")]
    for args, codes in (([*QWEN, "--tp", "2"], (1,)), (EAGLE, (1,)), (["--targets", world["targets"]], (1,))):
        data = valid("check", run_cli("check", *args, "--strict", "--env-from", world["env"], "--json", *cd), codes)
        assert not data["ok"] and all(w["misses"] for w in data["workers"] if w["autotunes"])
    missing = world["tmp"] / "bad.yaml"
    missing.write_text(json.dumps({"targets": [{"name": "x", "model": "Qwen/Qwen3-30B-A3B", "tpp": 1}]}))
    valid("check", run_cli("check", "--targets", str(missing), "--json", *cd), (2,))
    valid("plan", run_cli("plan", "--targets", str(missing), "--json", *cd), (2,))


@pytest.mark.xdist_group("host-env")
def test_tree_commands(world, host_env):
    cd = ["--cache-dir", str(world["root"])]
    valid("ls", run_cli("ls", "--json", *cd))
    valid("ls", run_cli("ls", "--dir", "--json", *cd))
    valid("show", run_cli("show", world["a"], "--json", *cd))
    valid("key", run_cli("key", "--model", "m", "--tp", "2", "--config-class", "LlamaConfig", "--arch", "sm90",
                         "--flashinfer-version", "0.7.2.post1", "--json", *cd))
    valid("diff", run_cli("diff", world["a"], world["a"], "--json", *cd))
    valid("convert", run_cli("convert", world["a"], "--layout", "flashinfer-v2", "--to", str(world["tmp"] / "v2"),
                             "--json", *cd))
    valid("prune", run_cli("prune", "--status", "unverified", "--dry-run", "--json", *cd))
    valid("rm", run_cli("rm", world["b"], "--dry-run", "--json", *cd))
    valid("rm", run_cli("rm", world["b"], "-y", "--json", *cd))
    valid("prune", run_cli("prune", "--status", "unverified", "-y", "--json", *cd))
    valid("prune", run_cli("prune", "--older-than", "1d", "--missing-ok", "-y", "--json",
                           "--cache-dir", str(world["tmp"] / "nowhere")))
    data = valid("env", host_env)
    assert isinstance(data["unknown"], list)


def test_transfers_and_stores(world):
    cd = ["--cache-dir", str(world["root"])]
    tgz = str(world["tmp"] / "x.tgz")
    valid("export", run_cli("export", "-o", tgz, "--dry-run", "--json", *cd))
    valid("export", run_cli("export", "-o", tgz, "--json", *cd))
    dest = ["--cache-dir", str(world["tmp"] / "dest")]
    (world["tmp"] / "dest").mkdir()
    valid("import", run_cli("import", tgz, "--dry-run", "--json", *dest))
    valid("import", run_cli("import", tgz, "--json", *dest))
    url = f"file://{world['tmp'] / 'store'}"
    valid("push", run_cli("push", url, "--dry-run", "--json", *cd))
    valid("push", run_cli("push", url, "--json", *cd))
    valid("ls", run_cli("ls", url, "--json"))
    valid("rm", run_cli("rm", url, world["a"], "--dry-run", "--json"))
    valid("prune", run_cli("prune", url, "--arch", "sm100", "--dry-run", "--json"))
    pulled = world["tmp"] / "pulled"
    pulled.mkdir()
    valid("pull", run_cli("pull", url, "--dry-run", "--any-env", "--json", "--cache-dir", str(pulled)))
    valid("pull", run_cli("pull", url, "--any-env", "--json", "--cache-dir", str(pulled)))
    h100 = world["tmp"] / "h100.json"
    h100.write_text(json.dumps({"fingerprint": {**DEFAULT_METADATA, "gpu": "NVIDIA H100"}, "arch": "sm90"}))
    other = world["tmp"] / "other"
    other.mkdir()
    dry = valid("pull", run_cli("pull", url, "--dry-run", "--env-from", str(h100), "--json", "--cache-dir", str(other)),
                (1,))
    real = valid("pull", run_cli("pull", url, "--env-from", str(h100), "--json", "--cache-dir", str(other)), (1,))
    assert dry["dry_run"] and not real["dry_run"] and dry["refused"] == real["refused"] and real["refused"]
    assert not real["imported"] and "another environment" in real["refused"][0]["reason"]  # refused whole, alike


def test_warm_one_entry_two_workers_and_a_fleet(world):
    env = gpu_env(world["tmp"])
    cd = ["--cache-dir", str(world["tmp"] / "warm")]
    one = valid("warm", run_gpu_cli("warm", *QWEN, "--tp", "2", "--json", *cd, env=env))
    assert [(w["target"], w["worker"], w["status"]) for w in one["workers"]] == [(None, "target", "written")]
    two = valid("warm", run_gpu_cli("warm", *EAGLE, "--json", *cd, env=env))
    assert [(w["target"], w["worker"], w["status"]) for w in two["workers"]] == [(None, "target", "written"),
                                                                                 (None, "draft", "written")]
    cd = ["--cache-dir", str(world["tmp"] / "fleet")]
    fleet = valid("warm", run_gpu_cli("warm", "--targets", world["targets"], "--json", *cd, env=env))
    # the speculative target's draft worker is tuned and written as its own entry, as single warm does
    assert {t["name"]: t["status"] for t in fleet["workers"]} == {"spec": "written", "spec draft": "written",
                                                                   "plain": "written"}
    single = valid("check", run_cli("check", *EAGLE, "--strict", "--json", *cd))
    assert [w["worker"] for w in single["workers"]] == ["target", "draft"] and single["ok"]


def test_doctor_every_recorded_log(tmp_path):
    """``doctor --json`` on every fixture log (tests/data/engine_logs/): exit 0 or 1, one envelope."""
    for log in sorted((REPO / "tests" / "data" / "engine_logs").glob("*.log")):
        data = valid("doctor", run_cli("doctor", str(log), "--cache-dir", str(tmp_path), "--json"), codes=(0, 1))
        assert data["servers"], log
