"""SGLang's cache-key schemas, one per range of releases, carried over from its source
(``flashinfer_autotune.py`` ``flashinfer_autotune_cache_path()``; docs/cache-layout.md), and which
release hashes which (``--engine sglang==X.Y.Z``). SGLang's engine declares them
(``Engine.key_schemas``); everything else finds them through the registry.
"""

from __future__ import annotations

import re

from autotune_cache.autotuner.installed import installed_version
from autotune_cache.errors import UsageError
from autotune_cache.plan.entry_key import (DEFAULT_SCHEMA, KeySchema, Renderer, get_schema, render_dtype,
                                           render_optional)

_COMMON_PARTS: tuple[tuple[str, Renderer], ...] = (
    ("model_path", lambda f: str(f.model_path)),
    ("dtype", lambda f: render_dtype(f.dtype)),
    ("quantization", lambda f: render_optional(f.quantization)),
    ("moe_runner_backend", lambda f: str(f.moe_runner_backend)),
    ("tp_size", lambda f: str(f.tp)),
    ("pp_size", lambda f: str(f.pp)),
    ("attn_dp_size", lambda f: str(f.attn_dp_size)),
    ("moe_ep_size", lambda f: str(f.ep)),
    ("config_class", lambda f: str(f.config_class)),
)

_DRAFT: tuple[str, Renderer] = (
    "draft_quant", lambda f: f"draft_quant={render_optional(f.draft_quantization)}" if f.is_draft else None,
)


def _skip_ops(always: frozenset[str] = frozenset()) -> tuple[str, Renderer]:
    # SGLang: "skip_ops=" + ",".join(sorted(set(--flashinfer-autotune-skip-ops) | WORKAROUND_SKIPS))
    return ("skip_ops", lambda f: "skip_ops=" + ",".join(sorted(set(f.skip_ops) | always)))


SCHEMAS: dict[str, KeySchema] = {
    # 0.5.23: flashinfer_autotune.py flashinfer_autotune_cache_path(), lines 164-214
    DEFAULT_SCHEMA: KeySchema(
        name=DEFAULT_SCHEMA,
        description="SGLang 0.5.23: fields 1-9, candidate_selection=v2_default, skip_ops=, [draft_quant=]",
        parts=_COMMON_PARTS + (("candidate_selection", lambda f: "candidate_selection=v2_default"), _skip_ops(), _DRAFT),
    ),
    # 0.5.18-0.5.22: the workaround skip set became empty (0.5.18); no candidate_selection yet
    "sglang-0.5.18": KeySchema(
        name="sglang-0.5.18",
        description="SGLang 0.5.18-0.5.22: fields 1-9, skip_ops=, [draft_quant=]",
        parts=_COMMON_PARTS + (_skip_ops(), _DRAFT),
    ),
    # 0.5.17 only (PR #31389): FLASHINFER_AUTOTUNE_WORKAROUND_SKIPS = {"mxfp8_gemm"} always joins the list
    "sglang-0.5.17": KeySchema(
        name="sglang-0.5.17",
        description="SGLang 0.5.17: fields 1-9, skip_ops= (always with mxfp8_gemm), [draft_quant=]",
        parts=_COMMON_PARTS + (_skip_ops(frozenset({"mxfp8_gemm"})), _DRAFT),
    ),
    # 0.5.12-0.5.16 (PR #24156, May 2026): fields 1-9; draft workers (0.5.15+) append draft_quant=
    "sglang-2605": KeySchema(
        name="sglang-2605",
        description="SGLang 0.5.12-0.5.16 (PR #24156): fields 1-9, [draft_quant=]",
        parts=_COMMON_PARTS + (_DRAFT,),
    ),
}

#: SGLang releases (from PyPI wheels 0.5.10.post1-0.5.23, diffed) -> the key schema they hash.
#: Releases before 0.5.12 never cached autotune results; after 0.5.23 is not known yet.
SGLANG_RELEASES: tuple[tuple[tuple[int, int, int], tuple[int, int, int], str], ...] = (
    ((0, 5, 12), (0, 5, 16), "sglang-2605"),
    ((0, 5, 17), (0, 5, 17), "sglang-0.5.17"),
    ((0, 5, 18), (0, 5, 22), "sglang-0.5.18"),
    ((0, 5, 23), (0, 5, 23), "sglang"),
)


def _release(version: str) -> tuple[int, int, int] | None:
    m = re.match(r"^\s*(\d+)\.(\d+)\.(\d+)", version)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def schema_for_sglang(version: str) -> str:
    """The key schema an SGLang release hashes (``0.5.20`` -> ``sglang-0.5.18``); a usage error
    for a release whose schema fi-autotune does not know, naming the ones it does."""
    release = _release(version)
    known = ", ".join(f"{'.'.join(map(str, lo))}-{'.'.join(map(str, hi))}" if lo != hi else ".".join(map(str, lo))
                      for lo, hi, _ in SGLANG_RELEASES)
    if release is None:
        raise UsageError(f"cannot read an SGLang version from {version!r}")
    for lo, hi, name in SGLANG_RELEASES:
        if lo <= release <= hi:
            return name
    if release < SGLANG_RELEASES[0][0]:
        raise UsageError(f"SGLang {version} does not cache FlashInfer autotune results (0.5.12 was the first)")
    raise UsageError(f"SGLang {version}: fi-autotune does not know its cache key (known: {known}); "
                     "pass --schema if you know it is unchanged")


#: What each SGLang release's wheel requires (``flashinfer_python[cu13]==0.7.2`` for 0.5.23; not the
#: 0.7.2.post1 of vLLM 0.33.0): tests/data/engine_flashinfer_pins.json, recorded from the wheels.
FLASHINFER_PINS = {"0.5.23": "0.7.2"}
#: The release fi-autotune reproduces when none is named and none is installed here.
DEFAULT_RELEASE = "0.5.23"


def serving_release(sglang_release: str | None) -> str:
    """The SGLang release that will serve: ``--engine sglang==X.Y.Z``, else the sglang installed
    here (package metadata), else 0.5.23 - the release ``pick_schema`` picks the key schema by."""
    if sglang_release:
        name, sep, version = sglang_release.partition("==")
        if name.strip().lower() != "sglang" or not sep:
            raise UsageError(f"--engine {sglang_release!r}: expected sglang==X.Y.Z")
        return version.strip()
    return installed_version("sglang") or DEFAULT_RELEASE


def pick_schema(schema: str | None, sglang_release: str | None) -> tuple[str, str]:
    """(key schema, where it came from): ``--schema``, else ``--engine sglang==X.Y.Z``, else the
    sglang installed in this Python (package metadata: no import), else SGLang 0.5.23's."""
    if schema:
        return get_schema(schema).name, "--schema"  # any engine's schema, by name
    if sglang_release:
        return schema_for_sglang(serving_release(sglang_release)), f"--engine {sglang_release}"
    here = installed_version("sglang")
    if here:
        return schema_for_sglang(here), f"sglang {here} installed here"
    return schema_for_sglang(DEFAULT_RELEASE), f"SGLang {DEFAULT_RELEASE} (no sglang installed here; --engine sglang==X.Y.Z picks another)"
