"""``key``: the low-level form of what ``plan``/``warm`` resolve from a model config; the test oracle."""

from __future__ import annotations

import click

from autotune_cache.errors import UsageError
from autotune_cache.autotuner.installed import installed_flashinfer_version
from autotune_cache.plan.entry_key import DEFAULT_SCHEMA, KeyFields, get_schema, key_schemas, render_dtype
from autotune_cache.registry import default_layout
from autotune_cache.autotuner.installed import VERSION_RE
from autotune_cache.autotuner.arch import ARCH_RE
from autotune_cache.plan.topology import Topology, TopologyError

from ..output import Output
from ..params import POSITIVE, cache_dir_option, json_option, quiet_option
from ..roots import resolve_root


@click.command("key")
@click.option("--model", required=True, help="The server's --model-path, verbatim.")
@click.option("--tp", type=POSITIVE, default=1, show_default=True)
@click.option("--pp", type=POSITIVE, default=1, show_default=True)
@click.option("--dp", type=POSITIVE, default=1, show_default=True, help="Attention DP size (or replicas with --no-dp-attention).")
@click.option("--ep", type=POSITIVE, default=1, show_default=True)
@click.option("--dtype", default="bfloat16", show_default=True)
@click.option("--quantization", default=None, help="As resolved by the server; 'None' for unset.")
@click.option("--moe-runner-backend", default="auto", show_default=True)
@click.option("--config-class", required=True, help="hf_config class name, e.g. GlmMoeDsaConfig.")
@click.option("--arch", required=True, help="Target arch dir, e.g. sm90 or sm100.")
@click.option("--flashinfer-version", default=None, help="Default: the installed flashinfer-python.")
@click.option("--skip-ops", default="", help="Comma-separated --flashinfer-autotune-skip-ops.")
@click.option("--schema", default=DEFAULT_SCHEMA, show_default=True, help=f"One of: {', '.join(sorted(key_schemas()))}.")
@click.option("--no-dp-attention", is_flag=True, help="--dp means independent replicas.")
@click.option("--draft-quantization", default=None, help="Compute the speculative draft worker's key.")
@cache_dir_option
@json_option
@quiet_option
def key_cmd(model, tp, pp, dp, ep, dtype, quantization, moe_runner_backend, config_class, arch,
            flashinfer_version, skip_ops, schema, no_dp_attention, draft_quantization, cache_dir, as_json, quiet):
    """Print the cache key, the joined key string and every rank file path of a topology."""
    schema_obj = get_schema(schema)
    arch = arch.lower()
    if not ARCH_RE.match(arch):
        raise UsageError(f"invalid --arch {arch!r}: expected sm<major><minor>, e.g. sm90 or sm100")
    try:
        topo = Topology(tp=tp, pp=pp, dp=dp, dp_attention=not no_dp_attention)
    except TopologyError as e:
        raise UsageError(str(e)) from None
    version = flashinfer_version or installed_flashinfer_version()
    if not version:
        raise UsageError("flashinfer-python is not installed: pass --flashinfer-version")
    if not VERSION_RE.match(version):
        raise UsageError(f"invalid --flashinfer-version {version!r}")
    fields = KeyFields(
        model_path=model, dtype=render_dtype(dtype), quantization=quantization,
        moe_runner_backend=moe_runner_backend, tp=tp, pp=pp, attn_dp_size=topo.attn_dp_size, ep=ep,
        config_class=config_class,
        skip_ops=tuple(sorted({s.strip() for s in skip_ops.split(",") if s.strip()})),
        draft_quantization=draft_quantization, is_draft=draft_quantization is not None,
    )
    key = schema_obj.key(fields)
    root = resolve_root(cache_dir, must_exist=False).path
    layout = default_layout()
    eid = layout.make_id((version, arch, key))
    kdir = layout.entry_dir(root, eid)
    files = [str(kdir / name) for name in layout.expected_files(topo)]
    out = Output(as_json, quiet)

    def human() -> None:
        out.line(f"key         {key}")
        out.line(f"id          {eid}")
        out.line(f"key string  {schema_obj.key_string(fields)}")
        out.line(f"key dir     {kdir}")
        out.line(f"rank files  ({len(files)})")
        for f in files:
            out.line(f"  {f}")

    out.emit(human=human, ids=[str(eid)], data={
        "key": key, "id": str(eid), "key_string": schema_obj.key_string(fields), "schema": schema,
        "key_fields": fields.to_dict(), "topology": topo.to_dict(), "key_dir": str(kdir), "rank_files": files})
