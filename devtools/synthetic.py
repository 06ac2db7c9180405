"""Synthetic but format-exact cache entries, for tests and benchmarks of the cache tree (not
shipped in the package: tests and benchmarks import it as ``devtools.synthetic`` from the
repository root).

The rank files follow ``AutoTuner.save_configs`` byte for byte in structure: ``_metadata``
first, keys sorted, ``_generation`` = sha256 of the compact sorted dump, ``indent=2``.
Only the tactics are made up; nothing here pretends to have tuned anything.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from autotune_cache.plan.entry_key import KeyFields, get_schema
from autotune_cache.registry import default_layout
from autotune_cache.tree.layouts.values import EntryId
from autotune_cache.tree.manifest import Manifest, utc_now_iso
from autotune_cache.autotuner.rankfile import cache_file_bytes
from autotune_cache.engines.vllm.layout import VllmRankName
from autotune_cache.plan.topology import Topology
from autotune_cache.tree.writer import commit_entry

from .fingerprint import DEFAULT_METADATA

HYBRID_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 8192)


def fake_configs(hidden: int = 7168, inter: int = 256, experts: int = 256, buckets=HYBRID_BUCKETS, seed: int = 0) -> dict[str, list]:
    """MoE gemm1/gemm2 and a dense fp8 GEMM, one config per bucket, shaped like real file keys."""
    rng = random.Random(seed)
    configs = {}
    for m in buckets:
        for op, shapes in (
            ("trtllm::fused_moe::gemm1", ((m, hidden), (experts, 2 * inter, hidden), (m, 8))),
            ("trtllm::fused_moe::gemm2", ((m * 8, inter), (experts, hidden, inter), (m, 8))),
            ("fp8_gemm", ((1, m, hidden), (1, hidden, 4 * inter), (1,), (1,), (1, m, 4 * inter))),
        ):
            extras = ("torch.bfloat16", 8, 8, 1, "Swiglu", True) if "moe" in op else ()
            runner = "MoERunner" if "moe" in op else rng.choice(["CublasFp8GemmRunner", "CudnnFp8GemmRunner"])
            key = str((op, runner, shapes, extras))
            configs[key] = [runner, [rng.randrange(64), rng.randrange(8)] if "moe" in op else rng.randrange(-1, 40), ["cold_l2", 10]]
    return configs


def make_manifest(
    fields: KeyFields, topology: Topology, flashinfer_version: str, arch: str,
    schema: str = "sglang", metadata: dict | None = None, stats: dict | None = None,
) -> Manifest:
    s = get_schema(schema)
    now = utc_now_iso()
    return Manifest(
        key=s.key(fields), schema=schema, key_string=s.key_string(fields), key_fields=fields,
        topology=topology, flashinfer_version=flashinfer_version, arch=arch,
        flashinfer_metadata=dict(metadata or DEFAULT_METADATA), rank_files={}, created=now, updated=now,
        stats=dict(stats or {}),
    )


def default_fields(model: str = "zai-org/GLM-5.1-FP8", tp: int = 8, dp: int = 8, ep: int = 1) -> KeyFields:
    return KeyFields(
        model_path=model, dtype="torch.bfloat16", quantization="fp8", moe_runner_backend="flashinfer_trtllm",
        tp=tp, pp=1, attn_dp_size=dp, ep=ep, config_class="GlmMoeDsaConfig",
    )


def write_fake_entry(
    root: Path, fields: KeyFields | None = None, topology: Topology | None = None,
    flashinfer_version: str = "0.7.2.post1", arch: str = "sm100", seed: int = 0,
    with_manifest: bool = True, buckets=HYBRID_BUCKETS, metadata: dict | None = None,
) -> EntryId:
    """Commit a complete entry through the real writer; returns its id."""
    fields = fields or default_fields()
    topology = topology or Topology(tp=fields.tp, pp=fields.pp, dp=fields.attn_dp_size, dp_attention=True)
    meta = {**DEFAULT_METADATA, "flashinfer_version": flashinfer_version, **(metadata or {})}
    manifest = make_manifest(fields, topology, flashinfer_version, arch, metadata=meta)
    data = cache_file_bytes(meta, fake_configs(seed=seed, buckets=buckets))
    files = {name: data for name in topology.rank_files()}
    layout = default_layout()
    eid = layout.make_id((flashinfer_version, arch, manifest.key))
    result = commit_entry(layout, root, eid, files, manifest if with_manifest else None)
    if result.refused:
        raise RuntimeError(f"{eid}: {result.refused[0][1]}")
    return eid


def entry_path(root: Path, eid: EntryId) -> Path:
    return default_layout().entry_dir(root, eid)


def write_plan_entry(plan, metadata: dict | None = None, drop_buckets: tuple[int, ...] = (), seed: int = 0) -> EntryId:
    """Commit the entry ``warm`` would write for ``plan``: every key its recipes predict, with
    made-up tactics (``drop_buckets`` leaves those buckets out, as an incomplete tune would)."""
    runner_of = re.compile(r"^\('[^']*', '([^']*)'")
    rng = random.Random(seed)
    res = plan.resolution
    meta = {**DEFAULT_METADATA, "flashinfer_version": plan.flashinfer_version, **(metadata or {})}
    files = {}
    for w in plan.workloads:
        entries = {}
        for op in w.ops:
            for b in op.buckets:
                if b in drop_buckets:
                    continue
                for key in op.recipe.file_keys(b):
                    entries[key] = [runner_of.match(key)[1], rng.randrange(16)]
        data = cache_file_bytes(meta, entries)
        for rank in w.ranks:
            files[rank] = data
    now = utc_now_iso()
    manifest = Manifest(plan.key, plan.schema, plan.key_string, res.key_fields, res.topology, plan.flashinfer_version,
                        res.arch, meta, {}, now, now,
                        request=plan.request.to_dict() if plan.request is not None else None)
    commit_entry(plan.layout_obj, plan.cache_root, plan.entry_id, files, manifest)
    return plan.entry_id


def write_vllm_entry(
    root: Path, config_hash: str, world: int = 2, dp: int = 1, flashinfer_version: str = "0.7.2.post1",
    arch_dir: str = "90a", seed: int = 0, metadata: dict | None = None, override_dir: bool = False,
) -> Path:
    """Write an entry the way vLLM 0.33 leaves one: every rank saves its own file (plain writes,
    no manifest), named ``autotune_configs_dp{d}_rank{d*world+r}.json``. ``override_dir``: the
    ``$VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR`` form (``root/<hash>``). Returns the entry dir."""
    meta = {**DEFAULT_METADATA, "flashinfer_version": flashinfer_version, **(metadata or {})}
    data = cache_file_bytes(meta, fake_configs(seed=seed))
    path = Path(root) / config_hash if override_dir else \
        Path(root) / "flashinfer_autotune_cache" / flashinfer_version / arch_dir / config_hash
    path.mkdir(parents=True, exist_ok=True)
    for d in range(dp):
        for r in range(world):
            (path / VllmRankName(d, d * world + r).filename).write_bytes(data)
    return path
