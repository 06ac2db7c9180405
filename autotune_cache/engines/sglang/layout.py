"""SGLang's tree (0.5.23, and the PR #24156 schema before it: same tree, another key).

``sglang/srt/model_executor/runner/flashinfer_autotune.py``::

    <root>/flashinfer/autotune/<flashinfer version>/sm<XY>/<key>/rank_tp{t}_pp{p}_dp{d}.json

``<root>`` is ``$SGLANG_CACHE_DIR`` used verbatim, else ``os.path.expanduser("~/.cache/sglang")``
(HOME, not XDG_CACHE_HOME). The ``flashinfer_megamoe`` backend appends ``_gpu<UUID>`` to rank
file names. With ``SGLANG_FLASHINFER_AUTOTUNE_CACHE=0`` SGLang writes its results under
``<key>/runs/`` instead.
"""

from __future__ import annotations

import re

from autotune_cache.plan.topology import RankName, Topology
from autotune_cache.tree.layouts.base import env_root
from autotune_cache.tree.layouts.values import Level, NameKind, RootChoice
from autotune_cache.tree.layouts.own_names import MANIFEST_NAME, TEMP_FILE_RE
from autotune_cache.tree.layout_kinds.rank_files import RankFileLayout
from autotune_cache.autotuner.arch import ARCH_RE
from autotune_cache.autotuner.installed import VERSION_RE

#: SGLang's side directory of per-run results (never read back by SGLang).
ENGINE_RUNS_DIRNAME = "runs"

KEY_RE = re.compile(r"^[0-9a-f]{16}\Z")


class SGLangLayout(RankFileLayout):
    name = "sglang"
    engine = "SGLang"
    description = "SGLang 0.5.x: $SGLANG_CACHE_DIR/flashinfer/autotune/<version>/<arch>/<key>/rank_*.json"
    key_from_serving_flags = True
    convert_targets = ("flashinfer-v2",)  # its tactics, in FlashInfer's managed store (`convert`)
    levels = (
        Level("flashinfer_version", "flashinfer version", VERSION_RE),
        Level("arch", "sm<XY> arch", ARCH_RE),
        Level("key", "cache key", KEY_RE),
    )
    def default_root(self) -> RootChoice:
        return env_root("SGLANG_CACHE_DIR", "~/.cache/sglang")

    def base_parts(self) -> tuple[str, ...]:
        return ("flashinfer", "autotune")

    def classify(self, name: str, is_dir: bool) -> NameKind:
        if is_dir:
            return NameKind.ENGINE_SIDE if name == ENGINE_RUNS_DIRNAME else NameKind.FOREIGN
        if RankName.parse(name):
            return NameKind.DATA
        if name == MANIFEST_NAME:
            return NameKind.MANIFEST
        if TEMP_FILE_RE.match(name):
            return NameKind.TEMP
        return NameKind.FOREIGN

    def expected_files(self, topology: Topology) -> list[str]:
        return topology.rank_files()

    def infer_topology(self, names: list[str]) -> Topology | None:
        ranks = [r for r in map(RankName.parse, names) if r is not None]
        return Topology.infer(ranks)

    def identical_groups(self, names: list[str], topology: Topology | None) -> list[tuple[str, list[str]]]:
        """SGLang all-gathers a digest over each TP group (one pp stage of one replica) and
        deletes every file of the group if they differ."""
        if topology is None:
            return []
        groups: dict[tuple[int, int], list[str]] = {}
        for name in names:
            rank = RankName.parse(name)
            if rank is not None:
                groups.setdefault(topology.tp_group_of(rank), []).append(name)
        return [(f"pp{pp}/replica{r}", files) for (pp, r), files in sorted(groups.items())]


#: The one instance: the engine and the registry (``KNOWN_LAYOUTS``) hand out this object.
LAYOUT = SGLangLayout()
