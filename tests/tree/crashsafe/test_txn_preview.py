"""A transaction that only previews (``import``/``pull --dry-run``) stages outside the tree and can never
commit: a dry run writes nothing in the tree, and no code path can turn its staging into a write."""

from __future__ import annotations

import pytest

from autotune_cache.registry import default_layout
from autotune_cache.tree.crashsafe.txn import Transaction
from autotune_cache.tree.writer import replace_policy
from devtools.synthetic import DEFAULT_METADATA, cache_file_bytes, fake_configs


def _stage(txn: Transaction, layout):
    eid = layout.make_id(("0.7.2.post1", "sm90", "0123456789abcdef"))
    txn.add_file(eid, "rank_tp0_pp0_dp0.json", cache_file_bytes(DEFAULT_METADATA, fake_configs(buckets=(1,))))
    return eid


def _previewing(tmp_path):
    """(layout, root, a preview-only transaction with one entry staged, its id, its scratch dir)."""
    layout, root = default_layout(), tmp_path / "tree"
    txn = Transaction(layout, root, preview_only=True)
    eid = _stage(txn, layout)
    return layout, root, txn, eid, txn._scratch


def test_a_preview_only_transaction_refuses_to_commit_and_leaves_no_scratch(tmp_path):
    layout, root, txn, eid, scratch = _previewing(tmp_path)
    assert not root.exists()  # not even the root was made
    assert scratch.is_dir() and not scratch.is_relative_to(root)
    staged = txn.staged[eid].stage
    assert staged.is_relative_to(scratch) and txn.staged[eid].target == layout.entry_dir(root, eid)
    with pytest.raises(RuntimeError, match="cannot commit"):
        txn.commit()
    assert not root.exists() and not scratch.exists()


def test_a_preview_decides_against_the_real_tree_and_cleans_up(tmp_path):
    layout, root, txn, eid, scratch = _previewing(tmp_path)
    result = txn.preview()
    assert [str(e) for e in result.committed] == [str(eid)] and not result.refused
    assert not root.exists() and not scratch.exists()
    writer = Transaction(layout, root)  # a real one stages beside its target, and commits
    _stage(writer, layout)
    assert writer._scratch is None and writer.commit().committed
    again = Transaction(layout, root, preview_only=True)
    _stage(again, layout)
    assert [str(e) for e in again.preview(replace_policy(layout, root, False)).unchanged] == [str(eid)]
