"""A cache path from a server's log, found in our trees: which entry it is, and is it there.

The server printed the path it read (``.../flashinfer/autotune/<version>/<arch>/<key>/rank_tp0_pp0_dp0.json``,
``.../autotune_configs_dp0_rank0.json``, FlashInfer's ``<root>/v2/<env hash>``). Whatever root it
sits under on the server, the path's tail names the entry in each layout (``CacheLayout.parse_member``);
we then look for that entry in the tree a user points at (``--cache-dir``) or the layouts' own roots.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from autotune_cache.plan.entry_key import DEFAULT_SCHEMA, KeyFields, get_schema
from autotune_cache.registry import layouts
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import EntryId, NameKind
from autotune_cache.tree.nearest import (Candidate, dir_differences, field_differences, nearest_difference_to,
                                         same_key_elsewhere)
from autotune_cache.tree.records import CacheEntry, CacheInfo
from autotune_cache.tree.scanner.scan import scan_cache


@dataclass(frozen=True)
class Located:
    layout: CacheLayout
    id: EntryId
    file: str | None  # the rank file's name; None for a managed store's env dir


def locate(path: str) -> Located | None:
    """The entry a server's cache path is in, by the most specific layout whose tail it fits."""
    parts = PurePosixPath(path).parts
    for lay in sorted(layouts().values(), key=lambda x: -(len(x.base_parts()) + len(x.levels))):
        depth = len(lay.base_parts()) + len(lay.levels)
        if not lay.base_parts():
            continue  # a bare hash dir (``vllm-dir``) fits any path: never a guess
        for tail, name in ((parts[-depth - 1:], parts[-1]), ((*parts[-depth:], "x"), None)):
            if len(parts) < len(tail) - (name is None):
                continue
            found = lay.parse_member("/".join(tail))
            if found is None:
                continue
            if name is not None and lay.classify(name, False) is not NameKind.DATA:
                continue
            if name is None and not lay.logged_dir_is_entry:
                continue  # a directory names an entry only in a store of one file per key
            return Located(lay, found[0], name)
    return None


class Trees:
    """Our trees, scanned on first use. ``roots`` (``--cache-dir``, repeatable: an SGLang root and a
    FlashInfer store root differ): for each layout the first that holds its tree; none given:
    each layout's own root, as the engine computes it here."""

    def __init__(self, roots: list[Path]) -> None:
        self.roots = roots
        self._infos: dict[str, CacheInfo | None] = {}

    def root(self, layout: CacheLayout) -> Path:
        if not self.roots:
            return layout.default_root().path
        return next((r for r in self.roots if layout.base(r).is_dir()), self.roots[0])

    def info(self, layout: CacheLayout) -> CacheInfo | None:
        if layout.name not in self._infos:
            root = self.root(layout)
            self._infos[layout.name] = scan_cache(root, layout) if layout.base(root).is_dir() else None
        return self._infos[layout.name]

    def entry(self, loc: Located) -> CacheEntry | None:
        info = self.info(loc.layout)
        return next((e for e in info.entries if e.id == loc.id), None) if info else None

    def candidates(self, layout: CacheLayout) -> list[Candidate]:
        info = self.info(layout)
        return [Candidate(e.id, e.manifest.key_fields if e.manifest else None, e.gpu)
                for e in (info.entries if info else ())]


def _mutations(fields: KeyFields, known: dict):
    """Each way ``fields`` could differ from the server's in one field: what SGLang's launch
    flags vary (sizes, backend, dtype, quantization, the draft worker)."""
    sizes = (1, 2, 4, 8, 16, 32, 64)
    values = {
        "tp": sizes, "pp": sizes, "attn_dp_size": sizes, "ep": sizes, "is_draft": (True, False),
        "dtype": ("bfloat16", "float16", "float32"),
        "quantization": (None, "fp8", "modelopt", "modelopt_fp8", "modelopt_fp4", "mxfp4", "w4afp8", "mxfp8"),
        "moe_runner_backend": ("auto", "flashinfer_cutlass", "flashinfer_trtllm", "flashinfer_trtllm_routed",
                               "flashinfer_mxfp4", "flashinfer_cutedsl", "flashinfer_megamoe", "triton", "deep_gemm"),
        "skip_ops": ((),),
    }
    for name, choices in values.items():
        for v in (*choices, *([known[name]] if name in known else [])):
            if getattr(fields, name) != v:
                yield name, dataclasses.replace(fields, **{name: v})
    if not fields.is_draft:
        for q in (None, fields.quantization, "fp8", "modelopt_fp4"):
            yield "is_draft", dataclasses.replace(fields, is_draft=True, draft_quantization=q)


def explain_sglang_key(trees: Trees, loc: Located, server_fields: dict) -> str | None:
    return explain_sglang(trees, loc, server_fields)[0]


def explain_sglang(trees: Trees, loc: Located, server_fields: dict) -> tuple[str | None, KeyFields | None]:
    """Why the server's key is not ours (and the server's key fields, where an entry shows
    them), in check's words, ranked by what would make the hit:
    first an entry of the server's own key under another FlashInfer version or arch directory
    (every key field matches: only the directory differs); then an entry whose key fields,
    changed in one field, hash to the server's key (that field is the difference, exactly);
    else the nearest entry by the fields the log states (``server_args``)."""
    candidates = trees.candidates(loc.layout)
    if (same := same_key_elsewhere(loc.id, loc.layout, candidates)) is not None:
        return f"the nearest entry, {same[0].id}, differs in {dir_differences(same[1])}", same[0].key_fields
    want_key = loc.id.name
    for c in candidates:
        if c.key_fields is None:
            continue
        schema = get_schema(DEFAULT_SCHEMA)
        for name, changed in _mutations(c.key_fields, server_fields):
            if schema.key(changed) == want_key:
                diffs = field_differences(c.key_fields.to_dict(), changed.to_dict())
                what = ("its speculative draft worker, whose entry is missing" if name == "is_draft"
                        else "; ".join(diffs[:3]))
                return f"the nearest entry, {c.id}, differs in {what}", changed
    return nearest_difference_to(loc.id, server_fields or None, loc.layout, candidates), None


def server_key_fields(args: dict | None) -> dict:
    """The key fields SGLang's ``server_args=`` line states (engine.py:311), as ``KeyFields`` names."""
    if not args:
        return {}
    out = {}
    for ours, theirs in (("model_path", "model_path"), ("moe_runner_backend", "moe_runner_backend"),
                         ("tp", "tp_size"), ("pp", "pp_size"), ("ep", "ep_size")):
        if isinstance(args.get(theirs), (str, int)) and not isinstance(args.get(theirs), bool):
            out[ours] = args[theirs]
    if "quantization" in args and (args["quantization"] is None or isinstance(args["quantization"], str)):
        out["quantization"] = args["quantization"]
    return out


def root_of(path: str, loc: Located) -> str:
    """The server's root for this layout (the part of its path above the layout's base)."""
    parts = PurePosixPath(path).parts
    depth = len(loc.layout.base_parts()) + len(loc.layout.levels) + (1 if loc.file else 0)
    return str(PurePosixPath(*parts[:-depth])) if len(parts) > depth else "/"
