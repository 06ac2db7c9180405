"""SGLang 0.5.23's startup log, as ``doctor`` reads it: its line prefix and rank tokens, the
lines of its autotune context (``flashinfer_autotune_context``: the target worker, a speculative
draft worker and the optional extend pass each open one, each with its own cache path), and the
words for what SGLang does on its own (cache reuse off, ranks' files dropped), and why a
server's key is not an entry of ours: SGLang hashes its key from fields its launch flags set, so
the field that differs is found exactly - change one field of an entry we hold, hash it, and see
whether it is the server's key.

Each format names the file:line in SGLang 0.5.23's wheel where its string is
(``tests/data/engine_logs/FORMATS.md`` lists them with the lines we do not need)."""

from __future__ import annotations

import dataclasses
import re

from autotune_cache.logs.dialect import TO_EOL, LineFormat, LogDialect, line_format
from autotune_cache.logs.trees import Located, Trees
from autotune_cache.plan.entry_key import DEFAULT_SCHEMA, KeyFields, get_schema
from autotune_cache.tree.nearest import dir_differences, field_differences, nearest_difference_to, same_key_elsewhere

#: ``[%(asctime)s{.msecs}{prefix}] %(message)s``, datefmt ``%Y-%m-%d %H:%M:%S``
#: (sglang/srt/utils/common.py:2630,2636); prefix `` DP0 PP1 ATTN_CP0 MOE_DP0 TP3 EP3``
#: (sglang/srt/managers/scheduler.py:6279-6291).
SGLANG_PREFIX = re.compile(
    r"\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d{3})?(?P<rank>(?: (?:DP|PP|ATTN_CP|MOE_DP|TP|EP)\d+)*)\] ")

_SG = "sglang/srt/model_executor/runner/flashinfer_autotune.py"

_MESSAGES: tuple[LineFormat, ...] = (
    line_format("sglang.cache", "pass.open", f"{_SG}:304", rf"^Running FlashInfer autotune with cache: {TO_EOL}"),
    line_format("sglang.reuse_disabled", "pass.open_fresh", f"{_SG}:313",
                r"^Running FlashInfer autotune \(cache reuse DISABLED via SGLANG_FLASHINFER_AUTOTUNE_CACHE=0\); "
                rf"writing fresh result to: {TO_EOL}"),
    line_format("sglang.diverged", "ranks.disagree", f"{_SG}:283",
                r"^FlashInfer autotune: per-rank caches disagree, discarding them and tuning from scratch"),
    line_format("sglang.completed", "pass.end", f"{_SG}:369", r"^FlashInfer autotune completed\.\s*$"),
    line_format("sglang.server_args", "server.args", "sglang/srt/entrypoints/engine.py:311,1185",
                r"^server_args=(?P<args>\{.*\})\s*$"),
)


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


def explain_sglang_key_miss(trees: Trees, loc: Located, server_fields: dict) -> tuple[str | None, KeyFields | None]:
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


class SGLangLines(LogDialect):
    name = "sglang"
    label = "SGLang"
    release = "0.5.23"
    prefix = SGLANG_PREFIX
    prefix_source = "sglang/srt/utils/common.py:2630"
    formats = _MESSAGES
    default_root = ".cache/sglang"
    command_placeholder = "python -m sglang.launch_server <the server's flags>"
    reuse_off = ("SGLANG_FLASHINFER_AUTOTUNE_CACHE=0 turns cache reuse off: every boot tunes from scratch",
                 "unset SGLANG_FLASHINFER_AUTOTUNE_CACHE")
    diverged = "the TP ranks' cache files differed, so SGLang deleted them and tuned from scratch"
    diverged_ep_note = "with EP {ep} SGLang's own files differ at every boot (sglang#40320): serve ours"

    def rank_of(self, prefix: re.Match) -> str | None:
        return prefix["rank"].strip() or "-"  # a scheduler without a prefix: one rank (tp 1)

    def rank_group(self, rank: str) -> str:
        """The TP group a rank is in: its prefix less the TP and EP tokens (``DP1 TP3`` -> ``DP1``);
        with dp-attention every rank shows a DP token yet all share one TP group, which is the
        conservative reading for a drop anyway (the whole group tunes again)."""
        return " ".join(t for t in rank.split() if not t.startswith(("TP", "EP", "DP")))

    def ep_size(self, args: dict | None) -> int | None:
        return (args or {}).get("ep_size")

    def explain_key_miss(self, trees, loc, args):
        """SGLang hashes its key from fields its flags set: the differing field is found exactly."""
        return explain_sglang_key_miss(trees, loc, server_key_fields(args))


DIALECT = SGLangLines()
