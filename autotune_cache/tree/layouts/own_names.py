"""fi-autotune's own names in a cache tree, the same in every layout: the manifest it writes in
each entry, its lock and journal dirs, staging and trash dirs, and temp files (its own and
FlashInfer's). Engines read only their own file names; every layout skips these."""

from __future__ import annotations

import re
from pathlib import Path

#: fi-autotune's record in each entry it writes; engines read only their own file names.
MANIFEST_NAME = "fi-autotune.manifest.json"
#: Per-entry lock files, outside the entry dirs so that deleting an entry never unlinks a lock
#: a waiting writer already holds open.
LOCKS_DIRNAME = ".fi-autotune-locks"
#: Owner locks: every process that writes in a tree holds ``<base>/.fi-autotune-locks/owners/
#: <token>.lock`` while it runs; a free one is a dead owner's (``crashsafe/locks.py``).
OWNER_LOCKS_PARTS = (LOCKS_DIRNAME, "owners")
#: Commit records of multi-entry writes (import of an archive): see ``txn.py``.
JOURNAL_DIRNAME = ".fi-autotune-journal"
#: Our hidden names all start with this; engines never read a dot-file.
OUR_PREFIX = ".fi-autotune-"
#: Temp files: ours (``atomic.py``) and FlashInfer's own ``save_configs`` (``.autotuner_*.tmp``).
TEMP_FILE_RE = re.compile(r"^(?:\.fi-autotune-.*\.tmp|\.autotuner_.*\.tmp)\Z")
#: Staging and trash dirs sit beside the entry they replace or remove, named by the owner
#: (a token whose lock is held while the owning command runs) and the entry's last id part.
STAGE_DIR_RE = re.compile(r"^\.fi-autotune-stage-(?P<owner>[0-9a-f]{12})-(?P<name>.+)\Z")
TRASH_DIR_RE = re.compile(r"^\.fi-autotune-trash-(?P<owner>[0-9a-f]{12})-(?P<name>.+)\Z")
#: A dry run's private scratch dir, in the temp dir, not in any tree (``txn``'s preview-only
#: transaction); a killed dry run's is removed by a later one (``recovery.sweep_dead_previews``).
PREVIEW_PREFIX = "fi-autotune-preview-"
#: ... as ``tempfile.mkdtemp`` names it: the prefix and 8 characters of its alphabet.
PREVIEW_DIR_RE = re.compile("^" + re.escape(PREVIEW_PREFIX) + r"[a-z0-9_]{8}\Z")


def owner_locks_dir(base: Path) -> Path:
    return base.joinpath(*OWNER_LOCKS_PARTS)


def stage_name(owner: str, entry_name: str) -> str:
    return f"{OUR_PREFIX}stage-{owner}-{entry_name}"


def trash_name(owner: str, entry_name: str) -> str:
    return f"{OUR_PREFIX}trash-{owner}-{entry_name}"
