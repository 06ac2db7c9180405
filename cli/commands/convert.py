"""``convert``: the tactics of an entry, written for another reader (no GPU, no tuning)."""

from __future__ import annotations

from pathlib import Path

import click

from autotune_cache.errors import FiAutotuneError
from autotune_cache.registry import get_layout
from autotune_cache.tree.convert import conversion_target, convert_choices, convert_entry, converts_to
from autotune_cache.tree.layouts.values import RootChoice
from autotune_cache.tree.scanner.scan import scan_cache
from autotune_cache.tree.status import EntryStatus

from ..output import Output
from ..params import cache_dir_option, json_option
from ..roots import resolve_root


class ConvertTarget(click.ParamType):
    """A layout entries convert into. Only those are offered (``--help``); naming one that does
    not take conversions (vllm) is a usage error that says why, not click's "not one of"."""

    name = "layout"

    def get_metavar(self, param, ctx=None) -> str:  # click 8.1 and 8.2 signatures
        return "[" + "|".join(n for n in convert_choices() if get_layout(n).accepts_conversion) + "]"

    def convert(self, value, param, ctx):
        try:
            conversion_target(value)
        except FiAutotuneError as e:
            self.fail(str(e), param, ctx)
        return value


@click.command("convert")
@click.argument("refs", nargs=-1, required=True, metavar="ID...")
@click.option("--layout", "target", required=True, type=ConvertTarget(),
              help="The layout to write the same tactics into.")
@click.option("--to", "to_root", default=None,
              help="Root of the target layout (default: its engine's own: $FLASHINFER_AUTOTUNE_CACHE_DIR, else "
                   "~/.cache/flashinfer/autotune - not under --cache-dir or $SGLANG_CACHE_DIR; the output names it).")
@cache_dir_option
@json_option
def convert_cmd(refs, target, to_root, cache_dir, as_json):
    """Write the tactics of tuned entries into another layout, without tuning again.

    `--layout flashinfer-v2`: FlashInfer's managed store (autotune_v2), keyed by the tuned
    files' environment: every key of the entry becomes one store entry, exactly as FlashInfer
    publishes it. (vLLM's per-rank files are not a conversion: vLLM calls FlashInfer with other
    arguments - use_fused_finalize, flattened tp - so its keys differ, and a vLLM that finds
    files skips tuning altogether; tune them with `warm --layout vllm`.)
    """
    out = Output(as_json)
    into = conversion_target(target)
    root = resolve_root(cache_dir, must_exist=True)
    info = scan_cache(root.path)
    entries = info.resolve(refs)
    choice = RootChoice(Path(to_root), "--to") if to_root else into.default_root()
    dest = choice.path
    # the destination is the target engine's own root, never --cache-dir's nor $SGLANG_CACHE_DIR's: said
    # first (stderr), so a store written under ~/.cache while the tree lives elsewhere is no surprise
    beside = "" if to_root or dest.is_relative_to(root.path) else f", not under {root.describe()}: {target} has its own root"
    out.note(f"writing {target} entries under {dest} (from {choice.source}){beside}"
             + ("" if to_root else "; --to ROOT writes elsewhere"))
    results = []
    for e in entries:
        if e.status != EntryStatus.COMPLETE or not converts_to(e, target):
            raise FiAutotuneError(f"{e.id} is {e.status}: only complete SGLang entries convert")
        result, values = convert_entry(e, target, dest)
        no_policy = sum(1 for v in values.values() if len(v) < 3)
        if no_policy:
            out.warn(f"{e.id}: {no_policy} tactics carry no measurement policy: FlashInfer replays them but re-tunes "
                     "them in tune mode")
        results.append((e, result))

    def human() -> None:
        for e, r in results:
            out.line(f"{e.id} -> {r.env_dir}: {r.written} entries written, {r.unchanged} unchanged"
                     + (f", {r.without_key_fields} without key_fields (served lazily)" if r.without_key_fields else ""))

    out.emit(human=human, data=[{"entry": str(e.id), **r.to_dict(), "root": str(dest), "root_source": choice.source}
                                for e, r in results],
             ids=[f"{target}:{r.env_hash}" for _, r in results])
