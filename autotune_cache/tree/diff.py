"""``diff``: which (op, bucket) lookups two caches answer differently.

Pin a known-good cache, tune again, and see what changed before shipping it. Two caches are
compared lookup by lookup: a *slot* is one lookup the engine makes - (custom op, bucketed input
shapes) - whatever runner answers it, since FlashInfer stores a winner under the key of the
runner that won. A slot is ``changed`` when its (runner, tactic, measurement policy) differ,
``added`` / ``dropped`` when only one side answers it (the engine would tune it at startup on
the other side). A slot's *tokens* is its bucket, read from the key's shapes. Sides are rank files, entries of a tree, whole trees, or a store pulled into a
scratch tree; entries are matched by id. No torch here; ``--measure`` lives in ``diffmeasure.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from autotune_cache.autotuner.rankfile import METADATA_KEY, RESERVED_KEYS, parse_file_key
from autotune_cache.autotuner.recipe import OpRecipe


@dataclass(frozen=True)
class Slot:
    custom_op: str
    profile: str  # repr of the bucketed input shapes (the key's nearest profile)
    tokens: int | None  # the bucket: the first input's first dimension

    @property
    def label(self) -> str:
        return f"{self.custom_op} @ {self.tokens if self.tokens is not None else '?'}"


def _dims(profile) -> list[tuple[tuple[int, int], int]]:
    out = []
    for i, shape in enumerate(profile if isinstance(profile, tuple) else ()):
        for j, d in enumerate(shape if isinstance(shape, tuple) else ()):
            if isinstance(d, int):
                out.append(((i, j), d))
    return out


def token_positions(keys) -> dict[str, tuple[int, int]]:
    """Where each custom op's bucket sits in its keys' shapes: of the dimensions that vary
    between its keys, the one with the smallest values (a MoE GEMM's rows are tokens x top-k;
    the tokens are the smaller). Ops with one key get none (their bucket is shown as '?')."""
    values: dict[str, dict[tuple[int, int], set]] = {}
    for key in keys:
        parsed = parse_file_key(key)
        if parsed is None:
            continue
        per_op = values.setdefault(parsed.custom_op, {})
        for pos, d in _dims(parsed.profile):
            per_op.setdefault(pos, set()).add(d)
    out = {}
    for op, per_pos in values.items():
        varying = [(max(v), pos) for pos, v in per_pos.items() if len(v) > 1]
        if varying:
            out[op] = min(varying)[1]
    return out


def slot_of(key: str, positions: dict[str, tuple[int, int]] | None = None) -> Slot:
    parsed = parse_file_key(key)
    if parsed is None:
        return Slot(key, "", None)
    pos = (positions or {}).get(parsed.custom_op)
    tokens = dict(_dims(parsed.profile)).get(pos) if pos is not None else None
    return Slot(parsed.custom_op, repr(parsed.profile), tokens)


def op_slots(op: dict, bucket: int) -> set[tuple[str, str]]:
    """The (custom op, shapes) lookups one planned op makes at ``bucket`` - from the keys its
    recipe predicts, whichever runner wins them. Several ops can share a custom op (a dense
    model's four fp8 GEMMs); their shapes tell them apart."""
    out = set()
    for key in OpRecipe.from_dict(op).file_keys(bucket):
        s = slot_of(key)
        out.add((s.custom_op, s.profile))
    return out


def pick_slots(configs: dict, slots: set[tuple[str, str]]) -> dict:
    """The entries of ``configs`` that answer these lookups."""
    out = {}
    for k, v in configs.items():
        if k in RESERVED_KEYS:
            continue
        s = slot_of(k)
        if (s.custom_op, s.profile) in slots:
            out[k] = v
    return out


@dataclass(frozen=True)
class SlotChange:
    slot: Slot
    kind: str  # changed | added | dropped
    key_a: str | None
    key_b: str | None
    a: list | None  # the cache value: [runner, tactic, policy?]
    b: list | None

    @property
    def what(self) -> str:
        """What changed, for a ``changed`` lookup: runner, tactic or only the measurement policy."""
        if self.kind != "changed":
            return self.kind
        if self.a[0] != self.b[0]:
            return "changed runner"
        if json.dumps(self.a[1:2]) != json.dumps(self.b[1:2]):
            return "changed tactic"
        return "changed policy"  # the engine's tuning-mode lookup checks it: a miss there

    def to_dict(self) -> dict:
        return {"custom_op": self.slot.custom_op, "tokens": self.slot.tokens, "profile": self.slot.profile,
                "kind": self.kind, "what": self.what, "key_a": self.key_a, "key_b": self.key_b, "a": self.a, "b": self.b}


def describe_value(v: list | None) -> str:
    if not v:
        return "-"
    return f"{v[0]}:{v[1] if len(v) > 1 else '?'}" + (f" {_policy(v[2])}" if len(v) > 2 else "")


def _policy(p) -> str:
    """A measurement policy in a few characters (FlashInfer stores a flat name/value list)."""
    if isinstance(p, list) and len(p) % 2 == 0:
        return "[" + ",".join(f"{p[i + 1]}" for i in range(0, len(p), 2)) + "]"
    return f"[{p}]"


def _same_value(a: list, b: list) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@dataclass(frozen=True)
class Comparison:
    """Two cache files (or two entries' one distinct file each) compared lookup by lookup."""

    label: str
    same: int
    changes: tuple[SlotChange, ...]
    a_configs: dict = field(default_factory=dict, repr=False, compare=False)  # for ``--measure``
    b_configs: dict = field(default_factory=dict, repr=False, compare=False)
    metadata: dict = field(default_factory=dict)  # field -> (A, B) where the files' _metadata differ

    @property
    def counts(self) -> dict:
        out = {"same": self.same, "changed": 0, "added": 0, "dropped": 0}
        for c in self.changes:
            out[c.kind] += 1
        return out

    @property
    def identical(self) -> bool:
        return not self.changes and not self.metadata

    def to_dict(self) -> dict:
        return {"label": self.label, **self.counts, "metadata": {k: list(v) for k, v in self.metadata.items()},
                "changes": [c.to_dict() for c in self.changes]}


def _entries(configs: dict) -> dict[str, list]:
    return {k: (list(v) if isinstance(v, list) else [v]) for k, v in configs.items() if k not in RESERVED_KEYS}


def _lookup(key: str) -> tuple[str, str]:
    """(custom op, shapes): what two runners' keys for one lookup share."""
    s = slot_of(key)
    return s.custom_op, s.profile


def compare_configs(a: dict, b: dict, label: str = "") -> Comparison:
    """Pair A's and B's keys: identical keys first (same runner, shapes and extras - extras can
    tell apart lookups of equal shapes, e.g. by dtype); then a key left on each side for the same
    (op, shapes) - another runner won it - one for one; whatever is left was added or dropped
    (a second key for a lookup the other side answers once is an addition: it can shadow)."""
    ea, eb = _entries(a), _entries(b)
    pa, pb = token_positions(ea), token_positions(eb)
    same = 0
    changes: list[SlotChange] = []
    for k in sorted(set(ea) & set(eb)):
        if _same_value(ea[k], eb[k]):
            same += 1
        else:
            changes.append(SlotChange(slot_of(k, pa), "changed", k, k, ea[k], eb[k]))
    left_a: dict[tuple, list[str]] = {}
    left_b: dict[tuple, list[str]] = {}
    for k in sorted(set(ea) - set(eb)):
        left_a.setdefault(_lookup(k), []).append(k)
    for k in sorted(set(eb) - set(ea)):
        left_b.setdefault(_lookup(k), []).append(k)
    for look in sorted(set(left_a) | set(left_b)):
        ka, kb = left_a.get(look, []), left_b.get(look, [])
        if len(ka) == 1 and len(kb) == 1 and look[1]:
            changes.append(SlotChange(slot_of(ka[0], pa), "changed", ka[0], kb[0], ea[ka[0]], eb[kb[0]]))
            continue
        changes += [SlotChange(slot_of(k, pa), "dropped", k, None, ea[k], None) for k in ka]
        changes += [SlotChange(slot_of(k, pb), "added", None, k, None, eb[k]) for k in kb]
    changes.sort(key=lambda c: (c.slot.custom_op, c.slot.tokens or 0, c.slot.profile, c.kind))
    ma, mb = a.get(METADATA_KEY) or {}, b.get(METADATA_KEY) or {}
    meta = {k: (ma.get(k), mb.get(k)) for k in sorted(set(ma) | set(mb)) if ma.get(k) != mb.get(k)} \
        if isinstance(ma, dict) and isinstance(mb, dict) else {"_metadata": (repr(ma)[:60], repr(mb)[:60])}
    return Comparison(label, same, tuple(changes), a, b, meta)


@dataclass(frozen=True)
class CacheUnit:
    """One entry's (or one file's) contents: rank file name -> parsed configs."""

    label: str  # an entry id, or a file path
    files: dict  # name -> configs
    manifest: object = None  # the entry's Manifest, when it has one (``--measure`` replays its request)
    is_file: bool = False  # one cache file given by path: its name means nothing
    notes: tuple = ()  # what could not be read (reported, not compared)

    def distinct(self) -> list[tuple[str, dict]]:
        """(names, configs) per distinct content: the ranks of one workload share one file."""
        groups: dict[str, list[str]] = {}
        contents: dict[str, dict] = {}
        for name in sorted(self.files):
            sig = json.dumps(self.files[name], sort_keys=True)
            groups.setdefault(sig, []).append(name)
            contents[sig] = self.files[name]
        return [(_names(names), contents[sig]) for sig, names in groups.items()]


def _names(names: list[str]) -> str:
    return ",".join(names) if len(names) <= 2 else f"{names[0]} (+{len(names) - 1} alike)"


def compare_units(a: CacheUnit, b: CacheUnit) -> tuple[list[Comparison], list[str], list[str]]:
    """Two entries: one comparison when each holds one distinct file (the ranks of a workload are
    alike), else rank file by rank file; rank files only one entry has are listed (the engine
    tunes at startup on a rank that has no file). A file against an entry: against each of the
    entry's distinct files."""
    da, db = a.distinct(), b.distinct()
    if a.is_file or b.is_file:
        pairs = [(f"vs {nb}" if len(db) > 1 else "", ca, cb) for _, ca in da for nb, cb in db] if a.is_file else \
                [(f"{na} vs" if len(da) > 1 else "", ca, cb) for na, ca in da for _, cb in db]
        return [compare_configs(ca, cb, label) for label, ca, cb in pairs], [], []
    only_a, only_b = sorted(set(a.files) - set(b.files)), sorted(set(b.files) - set(a.files))
    if len(da) == 1 and len(db) == 1:
        return [compare_configs(da[0][1], db[0][1], "")], only_a, only_b
    common = sorted(set(a.files) & set(b.files))
    return [compare_configs(a.files[n], b.files[n], n) for n in common], only_a, only_b


@dataclass
class DiffReport:
    a: str
    b: str
    comparisons: list[tuple[str, Comparison]] = field(default_factory=list)  # (entry label, comparison)
    only_a: list[str] = field(default_factory=list)  # entries (or rank files) only A has
    only_b: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # files that could not be read

    @property
    def identical(self) -> bool:
        return (not self.only_a and not self.only_b and not self.notes
                and all(c.identical for _, c in self.comparisons))

    @property
    def totals(self) -> dict:
        out = {"same": 0, "changed": 0, "added": 0, "dropped": 0}
        for _, c in self.comparisons:
            for k, v in c.counts.items():
                out[k] += v
        return out

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "identical": self.identical, **self.totals,
                "only_a": self.only_a, "only_b": self.only_b, "notes": self.notes,
                "comparisons": [{"entry": e, **c.to_dict()} for e, c in self.comparisons]}


def diff_units(a_label: str, b_label: str, a: list[CacheUnit], b: list[CacheUnit], *, by_id: bool) -> DiffReport:
    """Compare two sides. ``by_id``: trees (or stores) - entries are paired by id, the rest
    listed as only on one side; otherwise each side is one unit and they are compared directly."""
    report = DiffReport(a_label, b_label)
    report.notes = [f"A: {n}" for u in a for n in u.notes] + [f"B: {n}" for u in b for n in u.notes]
    if not by_id:
        comps, only_a, only_b = compare_units(a[0], b[0])
        report.comparisons = [("", c) for c in comps]
        report.only_a, report.only_b = only_a, only_b
        return report
    ia, ib = {u.label: u for u in a}, {u.label: u for u in b}
    for label in sorted(set(ia) & set(ib)):
        comps, only_a, only_b = compare_units(ia[label], ib[label])
        report.comparisons += [(label, c) for c in comps]
        report.only_a += [f"{label}/{n}" for n in only_a]
        report.only_b += [f"{label}/{n}" for n in only_b]
    report.only_a += sorted(set(ia) - set(ib))
    report.only_b += sorted(set(ib) - set(ia))
    return report
