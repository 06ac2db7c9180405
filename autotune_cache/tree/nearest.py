"""Which entry we have is nearest to the one an engine looked for, and which field differs.

``check`` (a predicted key) and ``doctor`` (a key read from the server's own log) explain a
miss alike, in one line: "the nearest entry, <id>, differs in <field>: <there> there, <here>
here". Kept on the tree's floor so both can use it.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune_cache.plan.entry_key import KeyFields
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import EntryId

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


#: The directories above the key, in the order a mismatch is named: an entry of the same key in
#: another FlashInfer version's or arch's directory is the nearest there can be (the key fields
#: all match), so it is named before any key field of another entry.
DIR_PARTS = ("flashinfer_version", "arch")
DIR_LABELS = {"flashinfer_version": "FlashInfer version", "arch": "arch"}


def same_key_elsewhere(want_id: EntryId, layout: CacheLayout,
                       candidates: list[Candidate]) -> tuple[Candidate, dict[str, tuple[str, str]]] | None:
    """The entry of ``want_id``'s own key under another version or arch directory, and what
    differs (``{"flashinfer_version": (there, here)}``): the one that differs in fewest parts,
    the arch kept over the version (a tuning is only valid on its arch). None if there is none."""
    want = layout.id_fields(want_id)
    best = None
    for c in candidates:
        if c.id.name != want_id.name or c.id == want_id:
            continue
        have = layout.id_fields(c.id)
        diffs = {p: (have.get(p), want.get(p)) for p in DIR_PARTS if have.get(p) != want.get(p)}
        rank = (len(diffs), "arch" in diffs)
        if diffs and (best is None or rank < best[0]):
            best = (rank, c, diffs)
    return (best[1], best[2]) if best else None


def dir_differences(diffs: dict[str, tuple[str, str]]) -> str:
    return "; ".join(f"{DIR_LABELS[p]} ({there} there, {here} for this server)" for p, (there, here) in diffs.items())


def nearest_difference_to(want_id: EntryId, ours: dict | None, layout: CacheLayout,
                          candidates: list[Candidate]) -> str | None:
    """One line: which key field (or path part) differs from the entry closest to ``want_id``.
    ``ours``: the wanted entry's key fields (``KeyFields.to_dict()``), or None where they are not
    known (then only an entry of the same key in another version or arch is compared). An entry
    of the same key in another version's or arch's directory comes first (``same_key_elsewhere``)."""
    if (same := same_key_elsewhere(want_id, layout, candidates)) is not None:
        return f"the nearest entry, {same[0].id}, differs in {dir_differences(same[1])}"
    want = layout.id_fields(want_id)
    best: tuple[int, str] | None = None
    for c in candidates:
        have = layout.id_fields(c.id)
        diffs = []
        if c.id.name == want_id.name:
            continue  # the same key elsewhere was taken above
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
