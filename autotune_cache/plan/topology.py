"""Serving topologies and the per-rank file names engines derive from them.

Every size here can come from data we did not write (a manifest, a rank file name, an archive),
so each is bounded: a ``tp`` of 10^9 must make an entry corrupt, not make ``ls`` build a
billion names.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

#: Largest tp / pp / dp / ep (and rank index) we accept from data. Real deployments reach a few
#: hundred GPUs per engine instance; a bound keeps hostile numbers from costing time or memory.
MAX_PARALLEL = 4096
#: Most rank files one entry may expect (tp x pp x replicas).
MAX_RANK_FILES = 65536

RANK_FILE_RE = re.compile(
    r"^rank_tp(?P<tp>[0-9]{1,9})_pp(?P<pp>[0-9]{1,9})_dp(?P<dp>[0-9]{1,9})(?:_gpu(?P<gpu>[0-9A-Za-z-]{1,64}))?\.json\Z"
)


class TopologyError(ValueError):
    """A topology that cannot exist, or one too large to be a real deployment."""


@dataclass(frozen=True, order=True)
class RankName:
    """One parsed ``rank_tp{t}_pp{p}_dp{d}[_gpu<uuid>].json`` name (SGLang's rank files)."""

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
def _rank_names(tp: int, pp: int, dp: int, dp_attention: bool, gpu_uuids: tuple[str, ...] = ()) -> tuple[RankName, ...]:
    names = []
    replicas = 1 if dp_attention else dp
    attn_tp = tp // dp if dp_attention else tp
    for replica in range(replicas):
        for p in range(pp):
            for t in range(tp):
                names.append(RankName(t, p, t // attn_tp if dp_attention else replica, gpu_uuids[t] if gpu_uuids else None))
    return tuple(sorted(names))


@functools.lru_cache(maxsize=1024)
def _rank_files(tp: int, pp: int, dp: int, dp_attention: bool, gpu_uuids: tuple[str, ...] = ()) -> tuple[str, ...]:
    return tuple(r.filename for r in _rank_names(tp, pp, dp, dp_attention, gpu_uuids))


#: ``str(torch.cuda.get_device_properties(i).uuid)``: nvidia-smi's UUID, lowercase, without "GPU-".
GPU_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


def normalize_gpu_uuid(text: str) -> str:
    """``GPU-DF3C1114-...`` (nvidia-smi) or ``df3c1114-...`` (torch) -> what SGLang puts in a name."""
    uuid = text.strip().lower().removeprefix("gpu-")
    if not GPU_UUID_RE.match(uuid):
        raise TopologyError(f"{text!r} is not a GPU UUID (nvidia-smi -L prints them: GPU-xxxxxxxx-xxxx-...)")
    return uuid


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
    #: flashinfer_megamoe (SGLang 0.5.22+) names each rank file after its GPU: ``..._gpu<uuid>.json``,
    #: the UUID of the GPU of tp rank t (single pipeline stage, one TP group).
    gpu_uuids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TopologyError(f"{name} must be a positive integer, got {value!r}")
            if value > MAX_PARALLEL:
                raise TopologyError(f"{name}={value} is beyond {MAX_PARALLEL}, the most fi-autotune accepts")
        if self.dp_attention and self.tp % self.dp:
            raise TopologyError(f"tp ({self.tp}) must be divisible by dp ({self.dp}) with dp-attention")
        files = self.tp * self.pp * (1 if self.dp_attention else self.dp)
        if files > MAX_RANK_FILES:
            raise TopologyError(f"{files} rank files is beyond {MAX_RANK_FILES}, the most fi-autotune accepts")
        if self.gpu_uuids:
            if self.pp != 1 or not (self.dp_attention or self.dp == 1):
                raise TopologyError("GPU-named rank files (flashinfer_megamoe) need one TP group and one pipeline stage")
            if len(self.gpu_uuids) != self.tp or not all(GPU_UUID_RE.match(u) for u in self.gpu_uuids):
                raise TopologyError(f"give one GPU UUID per tp rank ({self.tp}), lowercase, without 'GPU-'")

    @property
    def attn_dp_size(self) -> int:
        """What SGLang hashes as ``attn_dp_size``: ``--dp`` under dp-attention, else 1."""
        return self.dp if self.dp_attention else 1

    @property
    def describe(self) -> str:
        """``tp=8 pp=1 dp=8 (dp-attention)``; the dp mode only where dp > 1 gives it a meaning."""
        mode = ""
        if self.dp > 1:
            mode = " (dp-attention)" if self.dp_attention else " (replicas)"
        return f"tp={self.tp} pp={self.pp} dp={self.dp}{mode}"

    def rank_names(self) -> list[RankName]:
        return list(_rank_names(self.tp, self.pp, self.dp, self.dp_attention, self.gpu_uuids))

    def rank_files(self) -> list[str]:
        return list(_rank_files(self.tp, self.pp, self.dp, self.dp_attention, self.gpu_uuids))

    def tp_group_of(self, rank: RankName) -> tuple[int, int]:
        """(pp stage, replica): ranks sharing it must have byte-identical files."""
        return (rank.pp, 0 if self.dp_attention else rank.dp)

    @classmethod
    def infer(cls, ranks: "list[RankName] | tuple[RankName, ...]") -> "Topology | None":
        return _infer(tuple(ranks))

    @classmethod
    def _infer(cls, ranks: tuple[RankName, ...]) -> "Topology | None":
        """Best guess from rank file names alone (engine-written key dirs have no manifest).

        Replicas repeat the whole tp range under every dp index; dp-attention spreads the tp
        range over the dp indices. Missing files make this a lower bound, never a crash.
        Raises TopologyError for indices beyond the bounds (the caller reports the entry corrupt).
        """
        if not ranks:
            return None
        tp = max(r.tp for r in ranks) + 1
        pp = max(r.pp for r in ranks) + 1
        dps = sorted({r.dp for r in ranks})
        dp = max(dps) + 1
        by_tp = {r.tp: r.gpu for r in ranks if r.gpu}
        if by_tp:
            uuids = tuple(by_tp.get(t, "") for t in range(tp))
            if pp == 1 and all(GPU_UUID_RE.match(u) for u in uuids) and len(set(uuids)) == tp:
                return cls(tp=tp, pp=1, dp=dp, dp_attention=True, gpu_uuids=uuids) if tp % dp == 0 else None
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
        d = {"tp": self.tp, "pp": self.pp, "dp": self.dp, "dp_attention": self.dp_attention}
        if self.gpu_uuids:
            d["gpu_uuids"] = list(self.gpu_uuids)
        return d

    @classmethod
    def from_dict(cls, d: object) -> "Topology":
        """From a manifest; raises TopologyError on anything but four well-typed, bounded fields."""
        if not isinstance(d, dict):
            raise TopologyError("topology is not an object")
        try:
            tp, pp, dp, attn = d["tp"], d["pp"], d["dp"], d["dp_attention"]
        except KeyError as e:
            raise TopologyError(f"topology lacks {e.args[0]!r}") from None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (tp, pp, dp)) or not isinstance(attn, bool):
            raise TopologyError("topology fields have the wrong types")
        uuids = d.get("gpu_uuids") or ()
        if not isinstance(uuids, (list, tuple)) or not all(isinstance(u, str) for u in uuids):
            raise TopologyError("topology.gpu_uuids is not a list of strings")
        return _topology(tp, pp, dp, attn, tuple(uuids))


@functools.lru_cache(maxsize=1024)
def _infer(ranks: tuple[RankName, ...]) -> Topology | None:
    # Cached: engine-written trees repeat a few rank sets thousands of times.
    return Topology._infer(ranks)


@functools.lru_cache(maxsize=1024)
def _topology(tp: int, pp: int, dp: int, dp_attention: bool, gpu_uuids: tuple[str, ...] = ()) -> Topology:
    return Topology(tp=tp, pp=pp, dp=dp, dp_attention=dp_attention, gpu_uuids=gpu_uuids)
