"""Where engines look for FlashInfer autotune caches, and how the files in that tree are named.

Every path and file-name rule of the cache tree lives here and nowhere else, so the writer
(warm, import), the readers (ls, show, verify) and the cleaner (prune) cannot drift apart.

Tree (SGLang 0.5.23, ``sglang/srt/model_executor/runner/flashinfer_autotune.py``)::

    <root>/flashinfer/autotune/<flashinfer version>/sm<XY>/<key>/rank_tp{t}_pp{p}_dp{d}.json
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

AUTOTUNE_SUBDIR = ("flashinfer", "autotune")

#: fi-autotune's own record in each key dir; SGLang reads only ``rank_*.json`` so it is ignored there.
MANIFEST_NAME = "fi-autotune.manifest.json"
#: Per-key lock files live outside the key dirs so that deleting a key dir never unlinks a lock
#: a waiting writer already holds open (that would let two writers in at once).
LOCKS_DIRNAME = ".fi-autotune-locks"
#: SGLang writes here instead of the rank file when SGLANG_FLASHINFER_AUTOTUNE_CACHE=0.
ENGINE_RUNS_DIRNAME = "runs"

#: Temp files: ours (``atomic.py``) and FlashInfer's own ``save_configs`` (``.autotuner_*.tmp``).
OUR_TEMP_PREFIX = ".fi-autotune-"
TEMP_FILE_RE = re.compile(r"^(?:\.fi-autotune-.*\.tmp|\.autotuner_.*\.tmp)$")
#: Staging dirs for new entries: written whole, then renamed to the key dir in one step.
STAGE_DIR_RE = re.compile(r"^\.fi-autotune-stage-[0-9a-f]{16}-.+$")

KEY_RE = re.compile(r"^[0-9a-f]{16}$")
ARCH_RE = re.compile(r"^sm\d{2,3}[a-z]?$")
# FlashInfer versions are PEP 440 strings ("0.7.2.post1", "0.8.0rc1+cu130"); "unknown" is what
# SGLang writes when flashinfer has no __version__.
VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+!_-]*$")
RANK_FILE_RE = re.compile(
    r"^rank_tp(?P<tp>\d+)_pp(?P<pp>\d+)_dp(?P<dp>\d+)(?:_gpu(?P<gpu>[0-9A-Za-z-]+))?\.json$"
)


def sglang_cache_root() -> Path:
    """SGLang's ``envs.SGLANG_CACHE_DIR.get()``, reproduced exactly.

    The default is ``os.path.expanduser("~/.cache/sglang")`` (HOME, not XDG_CACHE_HOME); a value
    set in the environment is used verbatim, not expanded, so ``SGLANG_CACHE_DIR=~/x`` means a
    directory literally named ``~`` relative to the working directory, as it does for SGLang.
    """
    value = os.environ.get("SGLANG_CACHE_DIR")
    if value is None:
        return Path(os.path.expanduser("~/.cache/sglang"))
    return Path(value)


def autotune_dir(root: Path) -> Path:
    """``<root>/flashinfer/autotune``: the part of the engine cache that fi-autotune manages."""
    return Path(root).joinpath(*AUTOTUNE_SUBDIR)


def key_dir(root: Path, flashinfer_version: str, arch: str, key: str) -> Path:
    return autotune_dir(root) / flashinfer_version / arch / key


def lock_path(root: Path, flashinfer_version: str, arch: str, key: str) -> Path:
    return autotune_dir(root) / LOCKS_DIRNAME / flashinfer_version / arch / f"{key}.lock"


def arch_from_capability(major: int, minor: int) -> str:
    """SGLang: ``f"sm{major}{minor}"`` from ``torch.cuda.get_device_capability``."""
    return f"sm{major}{minor}"


def is_valid_version(name: str) -> bool:
    return bool(VERSION_RE.match(name)) and name != LOCKS_DIRNAME


@dataclass(frozen=True, order=True)
class RankName:
    """One parsed ``rank_tp{t}_pp{p}_dp{d}[_gpu<uuid>].json`` name."""

    tp: int
    pp: int
    dp: int
    gpu: str | None = None

    @property
    def filename(self) -> str:
        suffix = f"_gpu{self.gpu}" if self.gpu else ""
        return f"rank_tp{self.tp}_pp{self.pp}_dp{self.dp}{suffix}.json"

    @classmethod
    def parse(cls, filename: str) -> "RankName | None":
        return _parse_rank_name(filename)


@functools.lru_cache(maxsize=8192)
def _parse_rank_name(filename: str) -> RankName | None:
    # Cached: the same few names recur in every key dir of a large tree.
    m = RANK_FILE_RE.match(filename)
    if not m:
        return None
    return RankName(int(m["tp"]), int(m["pp"]), int(m["dp"]), m["gpu"])


@functools.lru_cache(maxsize=1024)
def _rank_names(tp: int, pp: int, dp: int, dp_attention: bool) -> tuple[RankName, ...]:
    names = []
    replicas = 1 if dp_attention else dp
    attn_tp = tp // dp if dp_attention else tp
    for replica in range(replicas):
        for p in range(pp):
            for t in range(tp):
                names.append(RankName(t, p, t // attn_tp if dp_attention else replica))
    return tuple(sorted(names))


@functools.lru_cache(maxsize=1024)
def _rank_files(tp: int, pp: int, dp: int, dp_attention: bool) -> tuple[str, ...]:
    return tuple(r.filename for r in _rank_names(tp, pp, dp, dp_attention))


@dataclass(frozen=True)
class Topology:
    """The serving topology that decides which rank files an engine reads.

    ``dp_attention=True``: ``--dp`` is attention data parallelism inside one TP group
    (SGLang ``--enable-dp-attention``); rank ``t`` reads ``dp = t // (tp // dp)``.
    ``dp_attention=False``: ``dp`` independent replicas, each a full TP group with its own
    ``dp_rank``. Either way the ranks of one TP group must hold byte-identical files, because
    SGLang all-gathers a digest over the TP group and deletes them all if they differ.
    """

    tp: int
    pp: int = 1
    dp: int = 1
    dp_attention: bool = True

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.dp_attention and self.tp % self.dp:
            raise ValueError(
                f"tp ({self.tp}) must be divisible by dp ({self.dp}) with dp-attention"
            )

    @property
    def attn_dp_size(self) -> int:
        """What SGLang hashes as ``attn_dp_size``: ``--dp`` under dp-attention, else 1."""
        return self.dp if self.dp_attention else 1

    def rank_names(self) -> list[RankName]:
        return list(_rank_names(self.tp, self.pp, self.dp, self.dp_attention))

    def rank_files(self) -> list[str]:
        return list(_rank_files(self.tp, self.pp, self.dp, self.dp_attention))

    def tp_group_of(self, rank: RankName) -> tuple[int, int]:
        """(pp stage, replica): ranks sharing it must have byte-identical files."""
        return (rank.pp, 0 if self.dp_attention else rank.dp)

    @classmethod
    def infer(cls, ranks: list[RankName]) -> "Topology | None":
        """Best guess from rank file names alone (engine-written key dirs have no manifest).

        Replicas repeat the whole tp range under every dp index; dp-attention spreads the tp
        range over the dp indices. Missing files make this a lower bound, never a crash.
        """
        if not ranks:
            return None
        tp = max(r.tp for r in ranks) + 1
        pp = max(r.pp for r in ranks) + 1
        dps = sorted({r.dp for r in ranks})
        dp = max(dps) + 1
        if dp == 1:
            return cls(tp=tp, pp=pp, dp=1, dp_attention=True)
        tps_per_dp = {d: {r.tp for r in ranks if r.dp == d} for d in dps}
        overlapping = any(
            tps_per_dp[a] & tps_per_dp[b] for i, a in enumerate(dps) for b in dps[i + 1 :]
        )
        if not overlapping and tp % dp == 0:
            return cls(tp=tp, pp=pp, dp=dp, dp_attention=True)
        return cls(tp=tp, pp=pp, dp=dp, dp_attention=False)

    def to_dict(self) -> dict:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "dp_attention": self.dp_attention}

    @classmethod
    def from_dict(cls, d: dict) -> "Topology":
        return _topology(int(d["tp"]), int(d["pp"]), int(d["dp"]), bool(d["dp_attention"]))


@functools.lru_cache(maxsize=1024)
def _topology(tp: int, pp: int, dp: int, dp_attention: bool) -> Topology:
    return Topology(tp=tp, pp=pp, dp=dp, dp_attention=dp_attention)
