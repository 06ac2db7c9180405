"""fi-autotune's FlashInfer v2 store, read back by FlashInfer's own store code (CPU)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from autotune_cache.autotuner.lookup_keys import TorchDtype, encode_key_fields, parse_key
from autotune_cache.plan.request import TuneRequest
from autotune_cache.plan.flags import ServerFlags
from devtools.synthetic import DEFAULT_METADATA, write_plan_entry

from ..conftest import run_cli, run_json
from ..support.lazy import importorskip_lazily

autotune_cache_mod = importorskip_lazily("flashinfer.autotune_cache")

FP8_KEY = ("('fp8_gemm', 'CublasFp8GemmRunner', ((1, 64, 8192), (1, 8192, 1024), (1,), (1,), (1, -1, 1024), (-1,)), "
           "(torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16))")


def test_key_strings_parse_to_what_flashinfer_encodes():
    fields = parse_key(FP8_KEY)
    assert str(fields) == FP8_KEY and fields[3][2] == TorchDtype("bfloat16")
    assert encode_key_fields(fields)["__tuple__"][3] == {"__tuple__": [{"__dtype__": "float8_e4m3fn"},
                                                                      {"__dtype__": "float8_e4m3fn"}, {"__dtype__": "bfloat16"}]}
    # FlashInfer's own decoder turns our encoding back into the very key
    assert str(autotune_cache_mod._decode_key_fields(encode_key_fields(fields))) == FP8_KEY
    assert parse_key("('a', 'R', ((1,),), (os.system('x'),))") is None
    assert parse_key("('a', 'R', ((1,),), (<Enum.X: 3>,))") is None


def _plans(root: Path):
    llama = TuneRequest("nvidia/Llama-3.1-70B-Instruct-FP8", ServerFlags(tp=4), arch="sm90", flashinfer_version="0.7.2.post1")
    qwen = TuneRequest("Qwen/Qwen3-30B-A3B", ServerFlags(tp=2, moe_runner_backend="flashinfer_cutlass"), arch="sm90",
                       flashinfer_version="0.7.2.post1")
    return [llama.plan(root), qwen.plan(root)]


@pytest.mark.parametrize("which", [0, 1], ids=["bmm_fp8", "cutlass_moe"])
def test_flashinfer_reads_back_every_entry(root, tmp_path, which):
    plan = _plans(root)[which]
    eid = write_plan_entry(plan, seed=which)
    v2root = tmp_path / "fi-autotune-v2"
    out = run_json("convert", str(eid), "--layout", "flashinfer-v2", "--to", str(v2root), "--cache-dir", str(root))
    (result,) = out["entries"]
    rank = json.loads(next((root / "flashinfer/autotune" / str(eid)).glob("rank_*.json")).read_text())
    keys = {k: v for k, v in rank.items() if not k.startswith("_")}
    assert result["written"] == len(keys) and result["without_key_fields"] == 0
    # FlashInfer's own store, for the environment those files were tuned in:
    manifest = {k: rank["_metadata"][k] for k in DEFAULT_METADATA}
    store = autotune_cache_mod.ManagedAutotuneCache(manifest, root=v2root)
    assert store.env_dir == Path(result["env_dir"]) and store.env_hash == result["env_hash"]
    entries, total, skipped = store.preload()
    assert (total, skipped) == (len(keys), 0)  # every entry preloads: key_fields round-trip to the key
    assert {str(kf) for kf, _ in entries} == set(keys)
    fresh = autotune_cache_mod.ManagedAutotuneCache(manifest, root=v2root)
    for key, value in keys.items():
        hit = fresh.lookup(key)
        assert hit is not None and (hit.runner, hit.tactic) == (value[0], value[1])
    # byte for byte what FlashInfer's publish() writes
    probe = autotune_cache_mod.ManagedAutotuneCache(manifest, root=tmp_path / "by-flashinfer")
    key, value = next(iter(keys.items()))
    probe.publish(key, value[0], value[1], key_fields=eval(key, {"__builtins__": {}, "torch": __import__("torch")}),
                  profiling_policy=None if len(value) < 3 else tuple(value[2]))
    name = hashlib.sha256(key.encode()).hexdigest()[:24] + ".json"
    assert (probe.entries_dir / name).read_bytes() == (store.entries_dir / name).read_bytes()
    assert (probe.env_dir / "manifest.json").read_bytes() == (store.env_dir / "manifest.json").read_bytes()
    # listed as its own layout, by its own id
    listed = run_json("ls", "--layout", "flashinfer-v2", "--cache-dir", str(v2root))
    (entry,) = listed["entries"]
    assert entry["id"] == f"flashinfer-v2:{result['env_hash']}" and entry["status"] == "complete"
    again = run_json("convert", str(eid), "--layout", "flashinfer-v2", "--to", str(v2root), "--cache-dir", str(root))
    assert again["entries"][0]["written"] == 0 and again["entries"][0]["unchanged"] == len(keys)


def test_vllm_is_not_a_conversion(root):
    eid = write_plan_entry(_plans(root)[1])
    proc = run_cli("convert", str(eid), "--layout", "vllm", "--cache-dir", str(root))
    assert proc.returncode == 2 and "warm --layout vllm" in proc.stderr


def test_check_the_store_the_serving_environment_reads(root, tmp_path):
    plan = _plans(root)[1]
    eid = write_plan_entry(plan)
    v2root = tmp_path / "v2root"
    assert run_cli("convert", str(eid), "--layout", "flashinfer-v2", "--to", str(v2root), "--cache-dir", str(root)).returncode == 0
    env = tmp_path / "env.json"
    env.write_text(json.dumps({"fingerprint": DEFAULT_METADATA, "arch": "sm90"}))
    args = ["check", "--layout", "flashinfer-v2", "--cache-dir", str(v2root), "--env-from", str(env), "--strict", "--json",
            "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass"]
    ok = run_cli(*args)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json.loads(ok.stdout)["workers"][0]["keys_checked"] == 42
    other = tmp_path / "h100.json"
    other.write_text(json.dumps({"fingerprint": {**DEFAULT_METADATA, "gpu": "NVIDIA H100 80GB HBM3"}, "arch": "sm90"}))
    miss = run_cli(*[a if a != str(env) else str(other) for a in args])
    assert miss.returncode == 1 and "no store for the serving environment" in miss.stdout
