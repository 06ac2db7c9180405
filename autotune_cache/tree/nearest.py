"""Which entry we have is nearest to the one an engine looked for, and which field differs.

``check`` (a predicted key) and ``doctor`` (a key read from the server's own log) explain a
miss alike, in one line: "the nearest entry, <id>, differs in <field>: <there> there, <here>
here". Kept on the tree's floor so both can use it.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune_cache.plan.entry_key import KeyFields
from autotune_cache.tree.layout import CacheLayout, EntryId

KEY_FIELD_LABELS = {
    "model_path": "model path (the server's --model-path: a hub id and a local path are different keys)",
    "dtype": "dtype",
    "quantization": "quantization",
    "moe_runner_backend": "MoE runner backend",
    "tp": "tp", "pp": "pp", "attn_dp_size": "attention-DP size (dp-attention)", "ep": "ep",
    "config_class": "config class",
    "skip_ops": "--flashinfer-autotune-skip-ops",
    "draft_quantization": "draft quantization", "is_draft": "draft worker",
}


@dataclass(frozen=True)
class Candidate:
    """An entry that is there, for "nearest entry" explanations."""

    id: EntryId
    key_fields: KeyFields | None
    gpu: str | None


def field_differences(theirs: dict, ours: dict) -> list[str]:
    """``tp: 8 there, 4 here`` for each key field that differs (only fields ``ours`` knows)."""
    return [f"{KEY_FIELD_LABELS.get(name, name)}: {theirs.get(name)!r} there, {value!r} here"
            for name, value in ours.items() if theirs.get(name) != value]


def nearest_difference_to(want_id: EntryId, ours: dict | None, layout: CacheLayout,
                          candidates: list[Candidate]) -> str | None:
    """One line: which key field (or path part) differs from the entry closest to ``want_id``.
    ``ours``: the wanted entry's key fields (``KeyFields.to_dict()``), or None where they are not
    known (then only an entry of the same key in another version or arch is compared)."""
    want = layout.id_fields(want_id)
    best: tuple[int, str] | None = None
    for c in candidates:
        have = layout.id_fields(c.id)
        diffs = []
        if c.id.name == want_id.name:
            for part in ("flashinfer_version", "arch"):
                if have.get(part) != want.get(part):
                    label = "FlashInfer version" if part == "flashinfer_version" else "arch"
                    diffs.append(f"{label} ({have.get(part)} there, {want.get(part)} for this server)")
        elif c.key_fields is not None and ours is not None:
            diffs = field_differences(c.key_fields.to_dict(), ours)
            for part in ("flashinfer_version", "arch"):
                if have.get(part) != want.get(part):
                    diffs.append(f"{part.replace('_', ' ')}: {have.get(part)} there, {want.get(part)} here")
        else:
            continue  # an engine-written entry of another key: nothing to compare field by field
        if diffs and (best is None or len(diffs) < best[0]):
            best = (len(diffs), f"the nearest entry, {c.id}, differs in " + "; ".join(diffs[:3]))
    return best[1] if best else None
