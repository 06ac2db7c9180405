"""FlashInfer cache keys, from their string form back to structure - without torch.

A key is ``str((custom_op, runner, nearest_profile, extras))`` where ``extras`` may hold torch
dtypes, whose repr (``torch.bfloat16``) is not literal syntax, so ``ast.literal_eval`` refuses
it. FlashInfer's v2 store wants the structure (``key_fields``, encoded ``{"__tuple__": ...}``,
``{"__dtype__": "bfloat16"}``) to preload entries, and checks ``str(decoded) == key``. This
parses the one shape keys take - tuples and lists of literals and ``torch.<name>`` - and
returns nothing for anything else (the entry is then written without ``key_fields``, as
FlashInfer itself does for keys it cannot encode: served lazily, never lost).
"""

from __future__ import annotations

import ast
from typing import Any

#: Longest key we parse (real ones are < 1 KB).
MAX_KEY_CHARS = 8192


class TorchDtype:
    """Stands for ``torch.<name>`` so that ``str()`` of a parsed key reproduces it exactly."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"torch.{self.name}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TorchDtype) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("torch", self.name))


class _Unparsable(Exception):
    pass


def _value(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (bool, int, float, str))):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and isinstance(node.operand.value, (int, float)) and not isinstance(node.operand.value, bool):
        return -node.operand.value
    if isinstance(node, ast.Tuple):
        return tuple(_value(e) for e in node.elts)
    if isinstance(node, ast.List):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
        return TorchDtype(node.attr)
    raise _Unparsable(type(node).__name__)


def parse_key(key: str) -> tuple | None:
    """The structure of a key string, or None when it is not one we can reproduce exactly."""
    if len(key) > MAX_KEY_CHARS:
        return None
    try:
        value = _value(ast.parse(key, mode="eval").body)
    except (_Unparsable, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not (isinstance(value, tuple) and len(value) == 4 and isinstance(value[0], str)) or str(value) != key:
        return None
    return value


def encode_key_fields(fields: Any) -> Any:
    """FlashInfer's ``_encode_key_fields`` encoding of a parsed key."""
    if fields is None or isinstance(fields, (bool, int, float, str)):
        return fields
    if isinstance(fields, TorchDtype):
        return {"__dtype__": fields.name}
    if isinstance(fields, tuple):
        return {"__tuple__": [encode_key_fields(f) for f in fields]}
    if isinstance(fields, list):
        return [encode_key_fields(f) for f in fields]
    raise TypeError(f"not a key component: {fields!r}")
