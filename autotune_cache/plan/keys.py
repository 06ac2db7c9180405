"""Engine cache-key schemas, as data.

A key dir name is ``sha256("|".join(parts))[:16]``. Which parts, in which order and how each
is rendered is engine- and version-specific; each schema below is the single source of truth
for one engine version, carried over from its source (see docs/cache-layout.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Callable

from autotune_cache.autotuner.installed import installed_version
from autotune_cache.errors import UsageError
from autotune_cache.plan.topology import MAX_PARALLEL as _MAX_SIZE

# torch dtype names SGLang's ModelRunner.dtype can take, and the spellings users type for them.
_DTYPE_ALIASES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
    "float32": "float32",
    "float": "float32",
    "fp32": "float32",
}


def render_dtype(dtype: str) -> str:
    """``str(torch.bfloat16)`` without importing torch: ``"torch.bfloat16"``."""
    name = dtype.strip()
    if name.startswith("torch."):
        name = name[len("torch.") :]
    canonical = _DTYPE_ALIASES.get(name.lower())
    if canonical is None:
        raise UsageError(
            f"unknown dtype {dtype!r}; expected one of: " + ", ".join(sorted(set(_DTYPE_ALIASES.values())))
        )
    return f"torch.{canonical}"


def render_optional(value: str | None) -> str:
    """``str(x)`` as SGLang does for an unset server arg: ``None`` renders as ``"None"``."""
    if value is None or value == "" or value == "None":
        return "None"
    return str(value)


@dataclass(frozen=True)
class KeyFields:
    """Everything an engine hashes into the key dir name, already resolved as the server would.

    ``attn_dp_size`` is what SGLang calls it: ``--dp`` with dp-attention, else 1.
    """

    model_path: str
    dtype: str
    quantization: str | None
    moe_runner_backend: str
    tp: int
    pp: int
    attn_dp_size: int
    ep: int
    config_class: str
    skip_ops: tuple[str, ...] = ()
    draft_quantization: str | None = None
    is_draft: bool = False

    def to_dict(self) -> dict:
        d = asdict(self)
        d["skip_ops"] = list(self.skip_ops)
        return d

    @classmethod
    def from_dict(cls, d: object) -> "KeyFields":
        """From a manifest or plan; raises ValueError unless every field has its type."""
        if type(d) is not dict:
            raise ValueError("key_fields is not an object")
        try:
            model, dtype, backend, config_class = d["model_path"], d["dtype"], d["moe_runner_backend"], d["config_class"]
            tp, pp, attn_dp, ep = d["tp"], d["pp"], d["attn_dp_size"], d["ep"]
        except KeyError as e:
            raise ValueError(f"key_fields lacks {e.args[0]!r}") from None
        quant, draft = d.get("quantization"), d.get("draft_quantization")
        skip_ops, is_draft = d.get("skip_ops") or (), d.get("is_draft", False)
        if not (type(model) is type(dtype) is type(backend) is type(config_class) is str):
            raise ValueError("key_fields has a name that is not a string")
        for name, v in (("tp", tp), ("pp", pp), ("attn_dp_size", attn_dp), ("ep", ep)):
            if type(v) is not int or not 0 < v <= _MAX_SIZE:
                raise ValueError(f"key_fields.{name} is not an integer in 1..{_MAX_SIZE}")
        if (quant is not None and type(quant) is not str) or (draft is not None and type(draft) is not str):
            raise ValueError("key_fields.quantization is not a string or null")
        if type(skip_ops) not in (list, tuple) or not all(type(s) is str for s in skip_ops) or type(is_draft) is not bool:
            raise ValueError("key_fields.skip_ops / is_draft have the wrong types")
        return cls(model, dtype, quant, backend, tp, pp, attn_dp, ep, config_class, tuple(skip_ops), draft, is_draft)


Renderer = Callable[[KeyFields], "str | None"]


@dataclass(frozen=True)
class KeySchema:
    """An ordered list of (field name, renderer). A renderer returning None omits the part."""

    name: str
    description: str
    parts: tuple[tuple[str, Renderer], ...] = field(repr=False)

    def key_parts(self, f: KeyFields) -> list[str]:
        rendered = (render(f) for _, render in self.parts)
        return [part for part in rendered if part is not None]

    def key_string(self, f: KeyFields) -> str:
        return "|".join(self.key_parts(f))

    def key(self, f: KeyFields) -> str:
        return hashlib.sha256(self.key_string(f).encode()).hexdigest()[:16]


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
    "sglang": KeySchema(
        name="sglang",
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
    import re

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


DEFAULT_SCHEMA = "sglang"


def get_schema(name: str) -> KeySchema:
    try:
        return SCHEMAS[name]
    except KeyError:
        raise UsageError(
            f"unknown key schema {name!r}; known: {', '.join(sorted(SCHEMAS))}"
        ) from None


def pick_schema(schema: str | None, sglang_release: str | None) -> tuple[str, str]:
    """(key schema, where it came from): ``--schema``, else ``--engine sglang==X.Y.Z``, else the
    sglang installed in this Python (package metadata: no import), else SGLang 0.5.23's."""
    if schema:
        return get_schema(schema).name, "--schema"
    if sglang_release:
        name, sep, version = sglang_release.partition("==")
        if name.strip().lower() != "sglang" or not sep:
            raise UsageError(f"--engine {sglang_release!r}: expected sglang==X.Y.Z")
        return schema_for_sglang(version), f"--engine {sglang_release}"
    here = installed_version("sglang")
    if here:
        return schema_for_sglang(here), f"sglang {here} installed here"
    return DEFAULT_SCHEMA, "SGLang 0.5.23 (no sglang installed here; --engine sglang==X.Y.Z picks another)"
