"""vLLM's per-rank files (0.33; ``vllm/model_executor/warmup/flashinfer_autotune_cache.py``)::

    $VLLM_CACHE_ROOT/flashinfer_autotune_cache/<flashinfer version>/<arch dir>/<config hash>/
        autotune_configs_dp{dp_rank}_rank{world_rank}.json

* ``$VLLM_CACHE_ROOT``: default ``$XDG_CACHE_HOME/vllm``, else ``~/.cache/vllm`` (expanded).
* ``<flashinfer version>/<arch dir>``: the last two parts of FlashInfer's JIT workspace dir,
  ``FLASHINFER_WORKSPACE_DIR`` = ``.../<version>/<archs>``, where ``<archs>`` joins the sorted
  target archs of the visible GPUs (or ``$FLASHINFER_CUDA_ARCH_LIST``): ``90a``, ``100a``,
  ``90a_100a`` on a mixed host.
* ``<config hash>``: ``sha256(vllm_config.compute_hash(include_version=False))``, 64 hex digits.
  Only vLLM can compute it (it depends on the whole resolved engine config); fi-autotune never
  imitates it.
* ``world_rank`` counts across data-parallel ranks: DP rank ``d`` of world size ``W`` (tp x pp x
  pcp) holds ranks ``d*W .. d*W+W-1``.

vLLM loads these files only when every rank of the tuning group has one with the same
``_metadata`` and the same number of top-level fields, and then skips its tuning pass entirely;
the files need not be byte-identical (each rank saves its own), so no group is checked for
identical bytes here.

With ``$VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR`` set, vLLM drops the ``<version>/<arch dir>`` levels:
``<that dir>/<config hash>/``. That tree is the ``vllm-dir`` layout. (Single-node single-rank
vLLM uses FlashInfer's managed store instead: the ``flashinfer-v2`` layout, rooted at that
same variable when it is set.)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from autotune_cache.tree.layout_kinds.flashinfer_v2.layout import FlashInferV2Layout
from autotune_cache.plan.topology import MAX_PARALLEL, MAX_RANK_FILES, Topology, TopologyError
from autotune_cache.tree.layouts.values import Level, NameKind, RootChoice
from autotune_cache.tree.layouts.own_names import MANIFEST_NAME, TEMP_FILE_RE
from autotune_cache.tree.layout_kinds.rank_files import RankFileLayout
from autotune_cache.autotuner.installed import VERSION_RE

HASH_RE = re.compile(r"^[0-9a-f]{64}\Z")
#: ``90a``, ``100a``, ``120f``, ``80``, joined by ``_`` on hosts with several archs.
ARCH_DIR_RE = re.compile(r"^[0-9]{2,3}[a-z]?(?:_[0-9]{2,3}[a-z]?){0,7}\Z")
RANK_FILE_RE = re.compile(r"^autotune_configs_dp(?P<dp>[0-9]{1,9})_rank(?P<rank>[0-9]{1,9})\.json\Z")
#: The variable that moves vLLM's files (and its managed store) to one directory.
OVERRIDE_ENV = "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"


@dataclass(frozen=True, order=True)
class VllmRankName:
    dp: int
    rank: int

    @property
    def filename(self) -> str:
        return f"autotune_configs_dp{self.dp}_rank{self.rank}.json"

    @classmethod
    def parse(cls, name: str) -> "VllmRankName | None":
        m = RANK_FILE_RE.match(name)
        return cls(int(m["dp"]), int(m["rank"])) if m else None


def vllm_cache_root() -> RootChoice:
    """``vllm.envs.VLLM_CACHE_ROOT``: ``expanduser($VLLM_CACHE_ROOT or $XDG_CACHE_HOME/vllm or ~/.cache/vllm)``."""
    if "VLLM_CACHE_ROOT" in os.environ:
        return RootChoice(Path(os.path.expanduser(os.environ["VLLM_CACHE_ROOT"])), "$VLLM_CACHE_ROOT")
    if "XDG_CACHE_HOME" in os.environ:
        return RootChoice(Path(os.path.expanduser(os.path.join(os.environ["XDG_CACHE_HOME"], "vllm"))),
                          "$XDG_CACHE_HOME/vllm")
    return RootChoice(Path(os.path.expanduser("~/.cache/vllm")), "the default ~/.cache/vllm")


def arch_dir(arch: str) -> str:
    """FlashInfer's JIT arch dir name for one GPU arch (``sm90`` -> ``90a``, ``sm100`` -> ``100a``,
    ``sm120`` -> ``120f``, ``sm80`` -> ``80``): ``CompilationContext._normalize_cuda_arch`` as of
    0.7.2.post1 (with CUDA 12.9+ for sm120)."""
    m = re.fullmatch(r"sm([0-9]+?)([0-9])([a-z]?)", arch)
    if not m:
        raise ValueError(f"{arch!r} is not an sm<XY> arch")
    major, minor = int(m[1]), int(m[2])
    if major < 9:
        return f"{major}{minor}"
    if major == 12 and minor == 0:
        return "120f"
    return f"{major}{minor}a"


class VllmLayout(RankFileLayout):
    name = "vllm"
    engine = "vLLM"

    def tuning_pass(self, plan, tuning: str) -> list[tuple[str, str]]:
        """``plan``'s rows on vLLM's startup pass into this tree (``Vllm.describe``)."""
        return [("Tuning pass", f"vLLM's {tuning}; vLLM loads the files and skips it when every rank has one"),
                ("Key", f"{plan.key}  ({plan.key_string})")]
    description = ("vLLM 0.33 (multi-rank): $VLLM_CACHE_ROOT/flashinfer_autotune_cache/<version>/<arch dir>/<config hash>/"
                   "autotune_configs_dp*_rank*.json")
    levels = (
        Level("flashinfer_version", "flashinfer version", VERSION_RE),
        Level("arch", "FlashInfer arch dir (90a, 100a, ...)", ARCH_DIR_RE),
        Level("key", "vLLM config hash", HASH_RE),
    )
    conversion_refusal = ("vLLM's files are not a conversion of SGLang's: vLLM calls FlashInfer with other arguments "
                          "(its keys differ) and skips tuning when its files exist; tune them with `warm --layout vllm`")

    def default_root(self) -> RootChoice:
        return vllm_cache_root()

    def base_parts(self) -> tuple[str, ...]:
        return ("flashinfer_autotune_cache",)

    def classify(self, name: str, is_dir: bool) -> NameKind:
        if is_dir:
            return NameKind.FOREIGN
        if RANK_FILE_RE.match(name):
            return NameKind.DATA
        if name == MANIFEST_NAME:
            return NameKind.MANIFEST
        if TEMP_FILE_RE.match(name) or VLLM_TEMP_RE.match(name):
            return NameKind.TEMP
        return NameKind.FOREIGN

    def expected_files(self, topology: Topology) -> list[str]:
        """Every DP rank's share of the world ranks (``topology.tp`` here is the world size of one
        DP rank: file names do not say how it splits into tp, pp and pcp)."""
        w = topology.tp * topology.pp
        return [VllmRankName(d, d * w + r).filename for d in range(topology.dp) for r in range(w)]

    def infer_topology(self, names: list[str]) -> Topology | None:
        """The smallest world size ``W`` per DP rank that puts every file's rank in its DP rank's
        range ``[d*W, (d+1)*W)``. Names no ``W`` fits were not written by vLLM: the entry is
        corrupt. (Files missing at the end of every range cannot be seen without a manifest.)"""
        ranks = [r for r in map(VllmRankName.parse, names) if r is not None]
        if not ranks:
            return None
        if max(max(r.dp, r.rank) for r in ranks) >= MAX_RANK_FILES or max(r.dp for r in ranks) >= MAX_PARALLEL:
            raise TopologyError(f"a dp or rank index beyond {MAX_RANK_FILES}")
        dp = max(r.dp for r in ranks) + 1
        lowest = max(r.rank // (r.dp + 1) + 1 for r in ranks)  # r < (d+1)*W
        highest = min((r.rank // r.dp for r in ranks if r.dp), default=None)  # d*W <= r
        if highest is not None and lowest > highest:
            raise TopologyError("rank file names that vLLM cannot produce (a rank outside its DP rank's range)")
        if lowest > MAX_PARALLEL:
            raise TopologyError(f"{lowest} ranks per DP rank is beyond {MAX_PARALLEL}")
        return Topology(tp=lowest, pp=1, dp=dp, dp_attention=False)

    def identical_groups(self, names: list[str], topology: Topology | None) -> list[tuple[str, list[str]]]:
        return []  # vLLM compares (_metadata, field count) across ranks, never bytes

    def arch_level(self, arch: str) -> str:
        return arch_dir(arch)

    def sm_archs(self, arch: str | None) -> set[str]:
        """``90a_100a`` -> {sm90, sm90a, sm100, sm100a}: a mixed host's dir serves each of its
        archs, named with or without FlashInfer's suffix."""
        return {f"sm{n}" for a in arch.split("_") for n in (a, re.sub("[a-z]$", "", a))} if arch else set()

    def describe_topology(self, topology: Topology) -> str:
        w = topology.tp * topology.pp
        return f"{w} rank{'s' if w > 1 else ''} per DP rank (tp x pp x pcp), dp={topology.dp}"

    def disagreement(self, rank_files: list, notes: list[str]) -> str | None:
        """vLLM's ``_all_ranks_have_matching_cache``: every rank's ``_metadata`` and field count must
        match, or vLLM tunes again (and overwrites the files). Metadata must match across every
        rank; counts only within a pipeline stage, which the names do not show: a note."""
        import json

        metas = {json.dumps(rf.metadata, sort_keys=True, default=str) for rf in rank_files if rf.ok}
        if len(metas) > 1:
            return "rank files carry different _metadata: vLLM would tune again and overwrite them"
        counts = {rf.num_configs for rf in rank_files if rf.ok}
        if len(counts) > 1:
            notes.append(f"rank files hold {min(counts)}-{max(counts)} entries: vLLM tunes again unless pp > 1 "
                         "puts the differing ranks in different stages")
        return None

    def parallel_str(self, topology: Topology | None, ep: int | None, inferred: bool = False) -> str:
        """``ranks4 dp2``: per-DP-rank world size, as the file names give it (``ranks4+`` when
        there is no manifest: the names give a lower bound)."""
        if topology is None:
            return "-"
        w = topology.tp * topology.pp
        return f"ranks{w}" + ("+" if inferred else "") + (f" dp{topology.dp}" if topology.dp > 1 else "")


#: vLLM's own temp files (``write_flashinfer_autotune_cache``): ``.<name>.<random>.tmp``.
VLLM_TEMP_RE = re.compile(r"^\.autotune_configs_dp[0-9]+_rank[0-9]+\.json\..*\.tmp\Z")


class VllmDirLayout(VllmLayout):
    """vLLM with ``$VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR``: config-hash dirs directly in that dir."""

    name = "vllm-dir"
    description = f"vLLM with ${OVERRIDE_ENV}: <that dir>/<config hash>/autotune_configs_dp*_rank*.json"
    levels = (Level("key", "vLLM config hash", HASH_RE),)
    #: FlashInfer's managed store shares this directory when vLLM runs single-rank.
    skip_names = frozenset({"v2"})
    conversion_refusal = None  # `convert --layout vllm` says why for both vLLM trees

    def default_root(self) -> RootChoice:
        value = os.environ.get(OVERRIDE_ENV)
        if value:
            return RootChoice(Path(os.path.expanduser(value)), f"${OVERRIDE_ENV}")
        return RootChoice(Path(os.devnull) / "unset", f"${OVERRIDE_ENV}")

    def configured(self) -> bool:
        return bool(os.environ.get(OVERRIDE_ENV))

    def base_parts(self) -> tuple[str, ...]:
        return ()


class VllmManagedStore(FlashInferV2Layout):
    """FlashInfer's managed store where a single-rank vLLM 0.33 reads it
    (``resolve_flashinfer_autotune_v2_root``): ``$VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR``, else
    FlashInfer's own default root. The same tree as the ``flashinfer-v2`` layout (whose name it
    keeps): only the root a plan goes under without ``--cache-dir`` differs. ``override_only``:
    for ``--layout vllm-dir``, whose server sets the variable (unset here: no root at all)."""

    def tuning_pass(self, plan, tuning: str) -> list[tuple[str, str]]:
        """``plan``'s rows on a single-rank vLLM's startup pass into the store (``Vllm.describe``)."""
        return [("Tuning pass", f"vLLM's {tuning} inside autotune_v2(mode=\"tune\", cache_root=<root>): every "
                                "lookup the store serves is not profiled"),
                ("Key", plan.key or "the tuning GPU's environment hash (FlashInfer's manifest.json; warm binds it)")]

    def __init__(self, override_only: bool = False) -> None:
        self.override_only = override_only

    def default_root(self) -> RootChoice:
        value = os.environ.get(OVERRIDE_ENV)
        if value:
            return RootChoice(Path(os.path.expanduser(value)), f"${OVERRIDE_ENV} (vLLM's managed-store root)")
        if self.override_only:
            return RootChoice(Path(os.devnull) / "unset", f"${OVERRIDE_ENV}")
        return super().default_root()

    def configured(self) -> bool:
        return bool(os.environ.get(OVERRIDE_ENV)) or not self.override_only


def single_rank(tp: int, pp: int, dp: int) -> bool:
    """``use_flashinfer_autotune_v2``: vLLM 0.33 on one node with world size 1 (so no PP) reads
    FlashInfer's managed store; every other deployment its per-rank files."""
    return tp * pp * dp == 1


#: The one instance of each: the engine and the registry (``KNOWN_LAYOUTS``) hand out these objects.
LAYOUT, DIR_LAYOUT = VllmLayout(), VllmDirLayout()
