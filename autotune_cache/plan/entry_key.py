"""An entry's key: the fields an engine hashes (``KeyFields``) and what a key schema is.

A key dir name is ``sha256("|".join(parts))[:16]``. Which parts, in which order and how each is
rendered is engine- and version-specific: each engine declares its schemas (SGLang's releases in
``engines/sglang/key_schemas.py``) and this module finds them through the registry.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Callable

from autotune_cache import registry
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


#: The default engine's newest schema (SGLang 0.5.23's): what a request hashes when nothing picks
#: another. ``engines/sglang/key_schemas.py`` names its schema by this constant.
DEFAULT_SCHEMA = "sglang"


def key_schemas() -> dict[str, KeySchema]:
    """Every engine's key schemas, by name: each engine declares its own (``Engine.key_schemas``),
    found through the registry, so this floor names no engine."""
    return registry.key_schemas()


def get_schema(name: str) -> KeySchema:
    known = key_schemas()
    try:
        return known[name]
    except KeyError:
        raise UsageError(f"unknown key schema {name!r}; known: {', '.join(sorted(known))}") from None
