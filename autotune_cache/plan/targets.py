"""Target lists: every (model, topology, backend) a fleet serves, in one file.

A targets file is YAML (the format deployment repos already hold) or JSON::

    defaults:                  # optional: fields every target gets unless it sets them
      arch: sm90
    targets:
      - model: nvidia/Llama-3.1-70B-Instruct-FP8
        tp: [4, 8]             # a list expands: one target per value (a matrix across fields)
      - name: qwen3-moe
        model: Qwen/Qwen3-30B-A3B
        model_path: /models/Qwen3-30B-A3B
        tp: 2
        moe_runner_backend: flashinfer_cutlass
        layouts: [sglang, flashinfer-v2]

A top-level list is the ``targets`` list alone. Field names are ``warm``'s flags, with ``_`` or
``-`` (``moe-runner-backend``); which names exist and what values they take is decided where the
flags are defined (the CLI), so a target and a command line never disagree. Fields that are lists
by nature (``skip_ops``, ``layouts``, ``gpu_uuids``) do not expand; a list of lists does.

Sharding (``--shard i/N``, or the index a Kubernetes Indexed Job, a Slurm array or torchrun
gives each process) splits the expanded list deterministically: every shard computes the same
assignment from the same file, so N machines tune disjoint parts and meet in a shared store.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from autotune_cache.errors import UsageError
from autotune_cache.safeopen import FileRefused, read_bounded

#: Fields whose value is a list by nature: a plain list is one value, a list of lists expands.
LIST_FIELDS = frozenset({"skip_ops", "layouts", "gpu_uuids"})
#: Read at most this much of a targets file, and expand to at most this many targets.
MAX_FILE_BYTES = 1 << 20
MAX_TARGETS = 10_000
#: Values (mappings, lists, scalars) a parsed file may hold, each alias counted where it is used:
#: no file within MAX_FILE_BYTES holds more without YAML aliases repeating each other (a "billion
#: laughs": 470 bytes that expand past memory).
MAX_VALUES = MAX_FILE_BYTES


@dataclass(frozen=True)
class Target:
    """One expanded target: its fields (flag names with ``_``), a name, where it came from."""

    name: str
    fields: dict
    source: str  # "targets.yaml: targets[1] (tp=8)"

    def to_dict(self) -> dict:
        return {"name": self.name, "fields": self.fields, "source": self.source}


def _norm(name: object, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise UsageError(f"{where}: field names are strings, got {name!r}")
    return name.strip().replace("-", "_")


def _fields(obj: object, where: str) -> dict:
    if not isinstance(obj, dict):
        raise UsageError(f"{where}: expected a mapping of fields, got {type(obj).__name__}")
    return {_norm(k, where): v for k, v in obj.items()}


def _scalars(k: str, v: list) -> None:
    if not all(isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in v):
        raise UsageError(f"field {k!r}: a list of names (or a list of such lists to expand over), not {v!r:.80}")


def _axes(fields: dict) -> list[tuple[str, list]]:
    """The fields a target expands over, with their values."""
    out = []
    for k, v in fields.items():
        if k == "name" or not isinstance(v, list):
            continue
        if k in LIST_FIELDS and not (v and all(isinstance(x, list) for x in v)):
            _scalars(k, v)
            continue
        for x in v if k in LIST_FIELDS else ():
            _scalars(k, x)
        if not v:
            raise UsageError(f"field {k!r} is an empty list: nothing to expand")
        out.append((k, v))
    return out


def _default_name(fields: dict) -> str:
    model = str(fields.get("model") or fields.get("model_path") or "target")
    return model.rstrip("/").rsplit("/", 1)[-1]


def parse_targets(data: object, label: str, base: Path | None = None) -> list[Target]:
    """Targets from a parsed file: ``defaults`` merged in, lists expanded, names made unique."""
    if isinstance(data, list):
        data = {"targets": data}
    if not isinstance(data, dict):
        raise UsageError(f"{label}: expected a list of targets or a mapping with 'targets'")
    unknown = set(data) - {"defaults", "targets"}
    if unknown:
        raise UsageError(f"{label}: unknown top-level key(s) {', '.join(sorted(map(str, unknown)))} "
                         "(expected 'defaults' and 'targets')")
    defaults = _fields(data.get("defaults") or {}, f"{label}: defaults")
    entries = data.get("targets")
    if not isinstance(entries, list) or not entries:
        raise UsageError(f"{label}: 'targets' must be a non-empty list")
    out: list[Target] = []
    for i, entry in enumerate(entries):
        where = f"{label}: targets[{i}]"
        fields = {**defaults, **_fields(entry, where)}
        try:
            axes = _axes(fields)
        except UsageError as e:
            raise UsageError(f"{where}: {e}") from None
        combos = 1
        for _, values in axes:
            combos *= len(values)
        if len(out) + combos > MAX_TARGETS:
            raise UsageError(f"{where}: expands past {MAX_TARGETS} targets")
        for values in itertools.product(*(v for _, v in axes)):
            f = dict(fields)
            chosen = dict(zip((k for k, _ in axes), values))
            f.update(chosen)
            if base is not None and isinstance(f.get("config"), str) and not os.path.isabs(f["config"]):
                f["config"] = str(base / f["config"])  # a config path is relative to the targets file
            name = str(f.pop("name", None) or _default_name(f))
            suffix = "-".join(f"{k}{v}" if isinstance(v, int) else f"{k}={v}" for k, v in chosen.items())
            note = f" ({', '.join(f'{k}={v}' for k, v in chosen.items())})" if chosen else ""
            out.append(Target(f"{name}-{suffix}" if suffix else name, f, where + note))
    seen: dict[str, int] = {}
    named = []
    for t in out:
        seen[t.name] = seen.get(t.name, 0) + 1
        named.append(t if seen[t.name] == 1 else Target(f"{t.name}#{seen[t.name]}", t.fields, t.source))
    return named


def load_targets(path: str | Path) -> list[Target]:
    """Read a targets file (YAML or JSON; ``-`` is stdin)."""
    import sys

    if str(path) == "-":
        text, label, base = sys.stdin.read(MAX_FILE_BYTES + 1), "stdin", None
    else:
        p = Path(path)
        try:  # a regular file only (a FIFO named here would block open() for ever), capped
            raw = read_bounded(p, MAX_FILE_BYTES, what="targets file")
        except FileRefused as e:
            raise UsageError(str(e)) from None
        except OSError as e:
            raise UsageError(f"cannot read targets file {path}: {e.strerror or e}") from None
        text, label, base = raw.decode("utf-8", errors="replace"), p.name, p.resolve().parent
    if len(text) > MAX_FILE_BYTES:
        raise UsageError(f"{label}: larger than {MAX_FILE_BYTES} bytes")
    if str(path).endswith(".json"):
        try:
            data = json.loads(text, object_pairs_hook=_unique_pairs)
        except ValueError as e:
            raise UsageError(f"{label}: not valid JSON ({e})") from None
        except RecursionError:  # [[[[... nested deeper than any targets file (hostile_files.py)
            raise UsageError(f"{label}: nested too deep to be a targets file") from None
    else:
        import yaml

        try:
            data = yaml.load(text, Loader=_unique_keys_loader())  # a safe loader; JSON is YAML too
        except yaml.YAMLError as e:
            raise UsageError(f"{label}: not valid YAML ({str(e).splitlines()[0]})") from None
        except RecursionError:
            raise UsageError(f"{label}: nested too deep to be a targets file") from None
    _count_values(data, label)
    return parse_targets(data, label, base)


def _unique_pairs(pairs: list) -> dict:
    """A JSON object whose keys are unique: ``tp: 4`` then ``tp: 8`` in one target is a slip that
    would warm another topology without a word (parsers keep the last)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        dup = next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i]))
        raise ValueError(f"the key {dup!r} is given twice in one object")
    return out


def _unique_keys_loader():
    """PyYAML's safe loader, refusing a mapping that gives one key twice (YAML requires unique
    keys; PyYAML keeps the last)."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: set[str] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # ``<<: *defaults``: its keys may be given again, that is what it is for
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, str):
                    continue
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice in one "
                                                            "mapping", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep)

    return UniqueKeys


def _count_values(data: object, label: str) -> None:
    """Refuse a file whose aliases expand past ``MAX_VALUES``, counting (never copying) each
    value where it is used, and stopping as soon as the count is past."""
    seen, stack = 0, [data]
    while stack:
        v = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise UsageError(f"{label}: expands to more than {MAX_VALUES} values (YAML aliases repeating each "
                             "other?): not a targets file")
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


# --- sharding ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shard:
    index: int  # 0-based
    count: int
    source: str  # --shard, or the scheduler the numbers came from

    def describe(self) -> str:
        return f"shard {self.index + 1} of {self.count} (index {self.index}, from {self.source})"


def parse_shard(text: str) -> Shard:
    """``i/N`` with 0 <= i < N (0-based, as JOB_COMPLETION_INDEX and RANK are)."""
    i, sep, n = text.partition("/")
    try:
        index, count = int(i), int(n)
    except ValueError:
        raise UsageError(f"--shard {text!r}: expected i/N, e.g. 0/4") from None
    if not sep or count < 1 or not 0 <= index < count:
        raise UsageError(f"--shard {text!r}: expected i/N with 0 <= i < N")
    return Shard(index, count, "--shard")


def shard_from_env(env: dict | None = None) -> Shard | None:
    """The shard a scheduler gave this process: a Kubernetes Indexed Job, a Slurm array, torchrun."""
    env = os.environ if env is None else env

    def num(name: str) -> int | None:
        v = env.get(name)
        try:
            return int(v) if v not in (None, "") else None
        except ValueError:
            raise UsageError(f"${name}={v!r} is not a number") from None

    if num("JOB_COMPLETION_INDEX") is not None and num("JOB_COMPLETIONS") is not None:
        idx, n, src = num("JOB_COMPLETION_INDEX"), num("JOB_COMPLETIONS"), "Kubernetes Indexed Job ($JOB_COMPLETION_INDEX/$JOB_COMPLETIONS)"
    elif num("SLURM_ARRAY_TASK_ID") is not None and num("SLURM_ARRAY_TASK_COUNT") is not None:
        # Array ids may start anywhere (--array=1-8): the index counts from the smallest.
        idx = num("SLURM_ARRAY_TASK_ID") - (num("SLURM_ARRAY_TASK_MIN") or 0)
        n, src = num("SLURM_ARRAY_TASK_COUNT"), "Slurm array ($SLURM_ARRAY_TASK_ID - $SLURM_ARRAY_TASK_MIN of $SLURM_ARRAY_TASK_COUNT)"
    elif num("RANK") is not None and num("WORLD_SIZE") is not None:
        idx, n, src = num("RANK"), num("WORLD_SIZE"), "torchrun ($RANK/$WORLD_SIZE)"
    else:
        return None
    if n < 1 or not 0 <= idx < n:
        raise UsageError(f"{src}: index {idx} is not in 0..{n - 1}")
    return Shard(idx, n, src)


def assign(weights: list[int], count: int) -> list[int]:
    """Shard of each target: longest first, each to the least loaded shard (ties: lowest index).
    Deterministic for a given list: every shard computes the same assignment."""
    load = [0] * count
    out = [0] * len(weights)
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        s = min(range(count), key=lambda s: (load[s], s))
        out[i] = s
        load[s] += max(1, weights[i])
    return out
