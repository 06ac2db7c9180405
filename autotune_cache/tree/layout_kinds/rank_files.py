"""A tree of rank-file entries (SGLang's, vLLM's per-rank files): what the layouts that hold them
answer about a plan's entry - what is there, how a warm writes it, how ``verify`` replays it and
how ``check`` reads it. FlashInfer's managed store answers the same questions its own way
(``tree/layout_kinds/flashinfer_v2/layout.py``); ``CacheLayout`` declares them, so each new kind must decide.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from autotune_cache.autotuner.rankfile import parse_cache_bytes, read_regular_file, summarize_ops
from autotune_cache.errors import FiAutotuneError
from autotune_cache.tree.scanner.entry_scan import scan_entry
from autotune_cache.tree.layouts.base import CacheLayout
from autotune_cache.tree.layouts.values import Existing, Replay
from autotune_cache.tree.manifest import Manifest, utc_now_iso
from autotune_cache.tree.writer import commit_entry, other_gpu_refusal, replace_policy


class RankFileLayout(CacheLayout):
    """Entries of one rank file per rank plus our manifest, written whole by a transaction."""

    writes = "rank_files"

    def entry_configs(self, counts: list[int]) -> int:
        return max(counts, default=0)  # each rank file holds them all

    def entry_ops(self, files: list, prefer: str | None = None) -> list | None:
        ok = [rf for rf in files if rf.error is None]
        for rf in sorted(ok, key=lambda r: r.name != prefer):
            try:
                return summarize_ops(rf.load())
            except (OSError, ValueError):
                continue
        return []

    def written_files(self, names: list[str]) -> list[str]:
        return sorted(names)

    def where_rows(self, plan, compact) -> list[tuple[str, str]]:
        return [("Key dir", str(plan.key_dir)), ("Rank files", f"{len(plan.rank_files)}: {compact(plan.rank_files)}")]

    def workload_title(self, plan, i: int, spans: str, ranks: tuple[str, ...], compact) -> str:
        return f"Workload {i}: {len(ranks)} rank(s) share it (layers {spans}): {compact(ranks)}"

    def written_words(self, plan) -> str:
        return f", copied to {len(plan.rank_files)} rank files"

    def checked_words(self, files: int) -> str:
        return f"{files} rank files, "

    def complete_words(self, quality: str | None) -> str:
        return f", tuned in {quality} mode" if quality else ", tuned by the engine or an older warm"

    def existing(self, plan, gpu_name: str | None) -> Existing:
        """Refused when another GPU model's (or, says the engine, another configuration's);
        complete when every rank file of the plan is there."""
        found = scan_entry(self, plan.key_dir, plan.entry_id)
        why = (other_gpu_refusal(found.gpu, gpu_name, plan.resolution.arch)
               or plan.engine.existing_entry_refusal(found.manifest, plan))
        return Existing(refusal=why, complete=found.complete_for(plan.rank_files),
                        quality=found.manifest.stats.get("quality") if found.manifest else None)

    def commit_tuning(self, plan, rank_bytes: dict[str, bytes], metadata: dict, stats: dict, extra: dict,
                      force: bool) -> str:
        """The manifest for ``plan`` and its rank files, committed in one step."""
        now = utc_now_iso()
        res = plan.resolution
        manifest = Manifest(
            key=plan.key, schema=plan.schema, key_string=plan.key_string, key_fields=res.key_fields,
            topology=res.topology, flashinfer_version=plan.flashinfer_version, arch=plan.arch_dir,
            flashinfer_metadata=metadata, rank_files={}, created=now, updated=now,
            stats={**stats, "model_source": plan.source.describe()},
            request=plan.request.to_dict() if plan.request is not None else None, extra=extra,
        )
        result = commit_entry(self, plan.cache_root, plan.entry_id, rank_bytes, manifest,
                              check=replace_policy(self, plan.cache_root, force))
        if result.refused:
            raise FiAutotuneError(f"{plan.entry_id}: {result.refused[0][1]}; nothing was written")
        return str(plan.key_dir)

    def stage_replay(self, key_dir: Path, ranks: list[str], tmp: Path, load, environment: dict) -> Replay:
        """vLLM's hit test (the only engine replayed from its files this way): every rank's file
        has one ``_metadata`` and one field count, else it tunes everything; then it loads rank 0's."""
        prints = {name: rank_fingerprint(key_dir / name) for name in ranks}
        source = str(key_dir / ranks[0])
        accepted = None not in prints.values() and len(set(prints.values())) == 1
        if accepted:
            shutil.copyfile(source, tmp / ranks[0])
            accepted = bool(load(str(tmp / ranks[0])))
        return Replay(source, accepted)

    def replayed_tunes(self, changed: list[bytes], profiled: list[str]) -> list[str]:
        """The tuner's new winners: nothing is written back to rank files during a replay."""
        return profiled

    def checked_by(self, plan, reader: CacheLayout, cache_dir: str | None) -> tuple[CacheLayout, Path | None]:
        """Read as its own engine reads it, unless ``check --layout`` names a store the serving
        environment keys (FlashInfer's managed store, written from this entry), at its root."""
        if isinstance(reader, RankFileLayout):
            return self, None
        return reader, Path(cache_dir) if cache_dir else reader.default_root().path

    def check_entry(self, plan, report, fingerprint, root: Path | None, store_url: str | None, files) -> None:
        if store_url is None:
            files.in_tree(plan, self, report, fingerprint)
        else:
            files.in_store(plan, self, report, fingerprint, store_url)


def rank_fingerprint(path: Path) -> tuple[str, int] | None:
    """vLLM's ``_autotune_cache_fingerprint``: the file's ``_metadata`` and its number of other fields."""
    try:
        obj = parse_cache_bytes(read_regular_file(path))
    except (OSError, ValueError):
        return None
    meta = obj.get("_metadata")
    return json.dumps(meta, sort_keys=True), len([k for k in obj if k != "_metadata"])
