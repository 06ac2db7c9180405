"""What every engine cache layout answers, in the manner of platformdirs' ``PlatformDirsABC``.

A layout is the shape of one engine's cache tree: where its root is by default, how deep the
directories go down to one *entry* (the unit that is written, listed, exported and deleted
whole), how the files inside an entry are named, which of them the engine expects for a
topology and which must be byte-identical. Scanning, pruning, writing and archiving are written
once against this interface; each engine gets one small module.

Key derivation (which hash names an entry) is not a layout's business: see ``keys.py``.

fi-autotune's own names (manifest, locks, journals, staging and trash dirs, temp files) are the
same in every layout: ``own_names.py``.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from pathlib import Path, PurePosixPath
from typing import ClassVar

from autotune_cache.errors import UsageError
from autotune_cache.plan.topology import Topology
from autotune_cache.tree.layouts.own_names import JOURNAL_DIRNAME, LOCKS_DIRNAME
from autotune_cache.tree.layouts.values import EntryId, Existing, Level, Misplaced, NameKind, Replay, RootChoice


class CacheLayout(ABC):
    """The shape of one engine's cache tree. Subclasses are stateless singletons."""

    #: Registry name, used in ids (``vllm:...``) and ``--layout``.
    name: ClassVar[str]
    #: Who reads it, for messages ("SGLang would not autotune...").
    engine: ClassVar[str]
    #: Who reads this tree, for help texts and docs.
    description: ClassVar[str]
    #: Directory levels from ``base(root)`` down to an entry dir.
    levels: ClassVar[tuple[Level, ...]]
    #: Subdirectories of an entry that hold its data files (bundled as ``<dir>/<name>``); an entry
    #: with any is merged file by file on import (``stage_bundle``/``merge_bundle``), never replaced.
    data_dirs: ClassVar[tuple[str, ...]] = ()
    #: Names directly in ``base(root)`` that belong to another layout sharing the directory.
    skip_names: ClassVar[frozenset[str]] = frozenset()
    #: What a warm writes, as ``plan --json`` names it (``writes``): "rank_files", "store_entries".
    writes: ClassVar[str]
    #: A directory a server's log names is an entry (a store of one file per key, whose entry is
    #: a directory), not only a file in one.
    logged_dir_is_entry: ClassVar[bool] = False
    #: ``diff`` reads this layout's entries as directories of whole cache files (FlashInfer's
    #: managed store is compared by converting an entry into it instead).
    diffs_entries: ClassVar[bool] = True
    #: fi-autotune derives this layout's entry key from the serving flags (``pull --model ...``
    #: names an entry); False where only the engine can compute it (vLLM's config hash).
    key_from_serving_flags: ClassVar[bool] = False
    #: Layouts a complete entry of this one can be written into without tuning again (``convert``).
    convert_targets: ClassVar[tuple[str, ...]] = ()
    #: Why no entry converts into this layout, said when ``convert --layout`` names it (None:
    #: the layout is no choice of ``convert`` at all, unless it implements ``convert_into``).
    conversion_refusal: ClassVar[str | None] = None

    # --- where -------------------------------------------------------------------------------
    @abstractmethod
    def default_root(self) -> RootChoice:
        """The engine's own root, exactly as the engine computes it."""

    def configured(self) -> bool:
        """False where the engine has no root at all until the user names one (an unset variable)."""
        return True

    def stage_bundle(self, eid: EntryId, files: dict[str, bytes]):
        """A merged layout's check of one entry read from bundles (``data_dirs``): an object with
        ``files``, ``metadata`` and ``records``; raises FiAutotuneError for what the engine would reject."""
        raise NotImplementedError(f"the {self.name} layout imports through a transaction")

    def merge_bundle(self, root: Path, eid: EntryId, staged, force: bool,
                     dry_run: bool = False) -> tuple[int, int, str | None]:
        """A merged layout's write of one staged entry: (files written, unchanged, refusal);
        ``dry_run``: the same answer, nothing written."""
        raise NotImplementedError(f"the {self.name} layout imports through a transaction")

    # --- a plan's entry: what is there, how tuning is written, replayed and checked --------------
    # Each kind answers these itself (uv's cache buckets, not flags): a tree of rank-file entries
    # (``rank_layout.RankFileLayout``) and FlashInfer's managed store, named by environment.

    def bind_environment(self, plan, metadata: dict):
        """``plan`` (a ``TuningPlan``) for the environment FlashInfer describes as ``metadata``
        (its ``_metadata``): unchanged where the path does not depend on it."""
        return plan

    @abstractmethod
    def existing(self, plan, gpu_name: str | None) -> "Existing":
        """What is at ``plan``'s entry directory (which exists), for ``warm``'s existing-entry rule."""

    @abstractmethod
    def commit_tuning(self, plan, rank_bytes: dict[str, bytes], metadata: dict, stats: dict, extra: dict,
                      force: bool) -> str:
        """A warm's tuned files written as this tree holds them, in one step (refusals raise):
        what was written, for the report."""

    @abstractmethod
    def stage_replay(self, key_dir: Path, ranks: list[str], tmp: Path, load, environment: dict) -> "Replay":
        """``verify``'s copy, under ``tmp``, of what the engine reads from ``key_dir`` (``load``:
        FlashInfer's ``load_configs``; ``environment``: this host's ``_metadata`` fields)."""

    @abstractmethod
    def replayed_tunes(self, changed: list[bytes], profiled: list[str]) -> list[str]:
        """The keys a replay tuned: from the files it changed in the copy, or the tuner's winners."""

    @abstractmethod
    def checked_by(self, plan, reader: "CacheLayout", cache_dir: str | None) -> "tuple[CacheLayout, Path | None]":
        """Which layout reads ``plan``'s entry when ``check --layout reader`` asks, and the root it
        reads (None: the plan's own tree or store)."""

    @abstractmethod
    def check_entry(self, plan, report, fingerprint, root: Path | None, store_url: str | None, files) -> None:
        """``check`` of ``plan``'s entry as this layout's engine reads it, into ``report`` (a
        ``check_report.CheckReport``); ``files``: the checks of rank files in a tree or store."""

    # --- what an entry's files hold, and how a plan's entry is told: each kind its own way ---

    @abstractmethod
    def entry_configs(self, counts: list[int]) -> int:
        """An entry's tuned keys, from the keys in each of its readable files."""

    @abstractmethod
    def entry_ops(self, files: list, prefer: str | None = None) -> list | None:
        """The ops an entry tuned (``rankfile.OpSummary``), from its readable file named
        ``prefer``, else the first; None where each file holds one key, not an op's buckets."""

    @abstractmethod
    def written_files(self, names: list[str]) -> list[str]:
        """Of the files a warm hands over, those ``warm --json`` names as written (``rank_files``)."""

    @abstractmethod
    def where_rows(self, plan, compact) -> list[tuple[str, str]]:
        """``plan``'s rows saying where a warm writes (label, text); ``compact`` shortens a list."""

    @abstractmethod
    def workload_title(self, plan, i: int, spans: str, ranks: tuple[str, ...], compact) -> str:
        """``plan``'s title line of workload ``i`` (layers ``spans``): who gets its winners."""

    @abstractmethod
    def written_words(self, plan) -> str:
        """What follows "N profiles to tune" in ``plan``: where each winner goes."""

    @abstractmethod
    def checked_words(self, files: int) -> str:
        """What ``check`` says it read besides the lookups ("4 rank files, ", or nothing)."""

    @abstractmethod
    def complete_words(self, quality: str | None) -> str:
        """What follows "already complete" when a warm finds the entry done (``quality``: the
        mode it was tuned in; None: by the engine or an older warm)."""

    @abstractmethod
    def base_parts(self) -> tuple[str, ...]:
        """Directory names from the root to the managed subtree (SGLang: flashinfer/autotune)."""

    def base(self, root: Path) -> Path:
        return Path(root).joinpath(*self.base_parts())

    def misplaced_root(self, path: Path) -> Misplaced | None:
        """``path`` given as this layout's root but lying inside a tree (its base dir, or a level
        under it down to an entry dir), or holding a tree nested in its own base (what writing
        with the base dir as the root leaves; no engine reads it): the root meant, else None.

        Read from the names alone (the base's, then each level's pattern), so that a root given
        one level off is refused before anything reads it as empty or writes a nested tree
        into it, whether it exists or not. A layout without a base dir of its own cannot tell
        its root from a level by name and answers None; one whose base name is common
        overrides this with a look at the disk (``flashinfer-v2``)."""
        base = self.base_parts()
        if not base:
            return None
        parts = Path(os.path.abspath(path)).parts
        for depth in range(len(self.levels) + 1):
            head, rest = parts[:len(parts) - depth], parts[len(parts) - depth:]
            if not all(level.valid(name) for level, name in zip(self.levels, rest)):
                continue
            if len(head) > len(base) and head[-len(base):] == base:
                root = Path(*head[:-len(base)])
                what = f"a {self.levels[depth - 1].name} dir" if depth else f"the {'/'.join(base)} dir"
                what += f" of the {self.name} tree at {root}, not its root"
                return Misplaced(root, what, f"give --cache-dir {root}")
        # Part of the base (``<root>/flashinfer``): a root may well be called so, so only where
        # the rest of the base is there beneath it.
        for k in range(1, len(base)):
            if len(parts) > k and parts[-k:] == base[:k] and Path(path).joinpath(*base[k:]).is_dir():
                root = Path(*parts[:-k])
                return Misplaced(root, f"the {'/'.join(base[:k])} dir of the {self.name} tree at {root}, not its root",
                                 f"give --cache-dir {root}")
        for k in range(1, len(base) + 1):  # a tree written with --cache-dir one of the base's dirs
            here = Path(path).joinpath(*base[:k])
            nested = here.joinpath(*base)
            if nested.is_dir() and (k == len(base) or here.joinpath(*base[k:]).is_dir()):
                return Misplaced(Path(path), f"a root holding a second tree nested inside its own at {nested} "
                                             f"(written with --cache-dir {here}; no engine reads it)",
                                 f"move what {nested} holds up into {self.base(Path(path))}, remove it, and run again")
        return None

    def entry_dir(self, root: Path, eid: EntryId) -> Path:
        return self.base(root).joinpath(*eid.parts)

    def lock_path(self, root: Path, eid: EntryId) -> Path:
        *dirs, last = eid.parts
        return self.base(root).joinpath(LOCKS_DIRNAME, *dirs, f"{last}.lock")

    def journal_dir(self, root: Path) -> Path:
        return self.base(root) / JOURNAL_DIRNAME

    # --- ids ---------------------------------------------------------------------------------
    def make_id(self, parts: tuple[str, ...]) -> EntryId:
        if len(parts) != len(self.levels) or not all(level.valid(p) for level, p in zip(self.levels, parts)):
            raise ValueError(f"{'/'.join(parts)!r} is not an entry of the {self.name} layout")
        return EntryId(self.name, tuple(parts))

    def parse_id(self, text: str) -> EntryId | None:
        """``0.7.2.post1/sm90/1ed66338588e9974`` (or with a ``<layout>:`` prefix); None if not one."""
        prefix, sep, rest = text.partition(":")
        if sep and prefix == self.name:
            text = rest
        parts = tuple(text.strip("/").split("/"))
        try:
            return self.make_id(parts)
        except ValueError:
            return None

    def id_fields(self, eid: EntryId) -> dict[str, str]:
        """``{"flashinfer_version": ..., "arch": ..., "key": ...}`` from an id's parts."""
        return {level.field: part for level, part in zip(self.levels, eid.parts)}

    def is_entry_name(self, name: str) -> bool:
        """Could ``name`` be an entry dir's own name (a bare key a user typed)?"""
        return self.levels[-1].valid(name)

    # --- inside an entry ---------------------------------------------------------------------
    @abstractmethod
    def classify(self, name: str, is_dir: bool) -> NameKind:
        """What a name found directly in an entry dir is."""

    @abstractmethod
    def expected_files(self, topology: Topology) -> list[str]:
        """The data files an engine of this topology reads from one entry."""

    @abstractmethod
    def infer_topology(self, names: list[str]) -> Topology | None:
        """Best guess of the topology from data file names alone (entries without a manifest).
        Raises ``TopologyError`` for names beyond the bounds (the entry is then corrupt)."""

    @abstractmethod
    def identical_groups(self, names: list[str], topology: Topology | None) -> list[tuple[str, list[str]]]:
        """Groups of data files that must hold the same bytes, each with a label for messages."""

    def arch_level(self, arch: str) -> str:
        """How the path spells the ``sm<XY>`` arch a plan targets (the inverse of ``sm_archs``)."""
        return arch

    def sm_archs(self, arch: str | None) -> set[str]:
        """The ``sm<XY>`` archs an entry's arch field stands for (what ``--arch`` filters match)."""
        return {arch} if arch else set()

    def describe_topology(self, topology: Topology) -> str:
        return topology.describe

    def parallel_str(self, topology: Topology | None, ep: int | None, inferred: bool = False) -> str:
        """``tp8 dp8a ep1`` for ``ls``: dp with ``a`` under dp-attention, ``r`` for replicas; ep is
        ``ep?`` when not recorded (an engine-written entry has no manifest to say). ``inferred``:
        the sizes are read off the files present, a lower bound (``tp3+``), never a count."""
        if topology is None:
            return "-"
        parts = [f"tp{topology.tp}" + ("+" if inferred else "")]
        if topology.pp > 1:
            parts.append(f"pp{topology.pp}")
        if topology.dp > 1:
            parts.append(f"dp{topology.dp}{'a' if topology.dp_attention else 'r'}")
        parts.append(f"ep{ep}" if ep is not None else "ep?")
        return " ".join(parts)

    def scan_entry(self, path: Path, eid: EntryId, fingerprint, atime_trusted: bool):
        """A ``CacheEntry`` for layouts whose entries are not a directory of rank files, read
        their own way; None (the default): the common scan (``tree.scanner.entry_scan``) reads it."""
        return None

    def disagreement(self, rank_files: list, notes: list[str]) -> str | None:
        """Why the engine would not use these files together although each is fine (beyond the
        byte-identical groups above), or None. May add notes for what cannot be decided."""
        return None

    # --- conversion --------------------------------------------------------------------------
    @property
    def accepts_conversion(self) -> bool:
        """Whether ``convert_into`` writes entries of another layout into this one."""
        return type(self).convert_into is not CacheLayout.convert_into

    def convert_into(self, entry, to_root: Path):
        """Write a complete entry of another layout (one that lists this in ``convert_targets``)
        into this layout under ``to_root``; returns what was written (a result with ``to_dict``)."""
        raise UsageError(self.conversion_refusal or f"nothing converts into the {self.name} layout")

    # --- archives ----------------------------------------------------------------------------
    def member_name(self, eid: EntryId, name: str) -> str:
        """Path of an entry's file inside an archive or bundle, relative to the root."""
        return "/".join((*self.base_parts(), *eid.parts, name))

    def parse_member(self, member: str) -> tuple[EntryId, str] | None:
        """(entry, file name) for a member path of this layout, else None."""
        parts = PurePosixPath(member).parts
        base = self.base_parts()
        depth = len(base) + len(self.levels) + 1
        if len(parts) != depth or parts[: len(base)] != base:
            return None
        try:
            eid = self.make_id(tuple(parts[len(base) : -1]))
        except ValueError:
            return None
        return eid, parts[-1]


def env_root(var: str, default: str) -> RootChoice:
    """A root taken verbatim from ``$var`` when set (as engines do), else ``expanduser(default)``."""
    value = os.environ.get(var)
    if value is None:
        return RootChoice(Path(os.path.expanduser(default)), f"the default {default}")
    return RootChoice(Path(value), f"${var}")
