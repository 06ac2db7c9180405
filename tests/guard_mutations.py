"""Each safety guard, deleted once: the test that guards it must fail.

    python tests/guard_mutations.py [name-substring ...]

For every guard against deleting, overwriting or escaping the tree, this replaces the guard's
line(s) with a no-op, runs the one test that should catch it, and restores the file. Every row
must say "caught". Not collected by pytest (it edits the source while it runs).
"""

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
MUTATIONS = [
    ("an unreadable version is never another version", "autotune_cache/tree/select.py",
     "            if e.flashinfer_version is None or e.flashinfer_version == self.other_versions_than:\n",
     "            if e.flashinfer_version == self.other_versions_than:\n",
     "tests/engines/test_vllm_layout.py::test_other_versions_never_takes_an_entry_whose_version_it_cannot_read"),
    ("a manifest naming another entry (vLLM's levels) is not trusted", "autotune_cache/tree/entry_scan.py",
     "    return manifest.key != eid.name or any(", "    return False and any(",
     "tests/engines/test_vllm_plan.py::test_a_manifest_naming_another_vllm_entry_is_not_trusted"),
    ("a vLLM hash already holding another configuration is not complete", "autotune_cache/engines/vllm/planner.py",
     "    if not diffs:\n        return None\n", "    return None\n",
     "tests/engines/test_vllm_plan.py::test_a_hash_reused_for_another_configuration_is_refused"),
    ("vllm-dir skips the v2 store beside it", "autotune_cache/tree/walk.py",
     " or name in layout.skip_names)", ")",
     "tests/engines/test_vllm_layout.py::test_vllm_dir_layout_follows_the_override_and_leaves_v2_alone"),
    ("prune changed-since-plan guard", "autotune_cache/tree/delete.py",
     "            if now.state != entry.state:\n", "            if False:\n",
     "tests/cli/test_cli.py::test_prune_leaves_an_entry_changed_since_the_plan"),
    ("delete refuses foreign files", "autotune_cache/tree/delete.py",
     "            if not now.only_ours:\n", "            if False:\n",
     "tests/tree/test_reliability.py::test_prune_reports_what_it_could_not_delete"),
    ("writer refuses to replace foreign files", "autotune_cache/tree/txn.py",
     "                    why = _replaceable(self.layout, s.target)\n", "                    why = None\n",
     "tests/tree/test_reliability.py::test_import_over_an_entry_holding_a_foreign_file_is_refused"),
    ("manifest fast path", "autotune_cache/tree/entry_scan.py",
     "        if rec is not None and rec.size == st.st_size", "        if False and rec is not None and rec.size == st.st_size",
     "tests/tree/test_scan.py::test_manifest_fast_path_reads_no_rank_file"),
    ("ctime in the fast path", "autotune_cache/tree/entry_scan.py",
     "and (rec.ctime_ns is None or rec.ctime_ns == st.st_ctime_ns)", "and True",
     "tests/tree/test_scan.py::test_edit_with_mtime_put_back_is_still_seen"),
    ("young temp files (plan)", "autotune_cache/tree/delete.py",
     "    out += [t for t in info.stale_temp if now - t.mtime >= STALE_TEMP_AGE_S]", "    out += list(info.stale_temp)",
     "tests/tree/test_reliability.py::test_prune_keeps_young_temp_files"),
    ("young temp files (execute)", "autotune_cache/tree/delete.py",
     "                elif stat_mod.S_ISREG(st.st_mode) and now - st.st_mtime >= STALE_TEMP_AGE_S:", "                elif stat_mod.S_ISREG(st.st_mode):",
     "tests/tree/test_reliability.py::test_a_temp_file_touched_after_the_plan_stays"),
    ("symlink refusal", "autotune_cache/tree/atomic.py",
     "            if stat_mod.S_ISLNK(st.st_mode):\n                raise FiAutotuneError(f\"{path} is a symlink", "            if False:\n                raise FiAutotuneError(f\"{path} is a symlink",
     "tests/tree/test_reliability.py::test_import_never_writes_through_a_symlinked_dir"),
    ("not-a-dir refusal", "autotune_cache/tree/atomic.py",
     "            if not stat_mod.S_ISDIR(st.st_mode):\n                raise FiAutotuneError(f\"{path} exists and is not a directory\")", "            if False:\n                raise FiAutotuneError(f\"{path} exists and is not a directory\")",
     "tests/tree/test_reliability.py::test_a_file_where_a_directory_belongs"),
    ("ratio cap", "autotune_cache/tree/archive.py",
     "                if total > RATIO_GRACE_BYTES and total > MAX_RATIO * counting.count:", "                if False:",
     "tests/tree/test_reliability.py::test_bomb_is_refused_for_its_ratio"),
    ("other-GPU refusal", "autotune_cache/tree/writer.py",
     "        why = other_gpu_refusal(existing.gpu, (staged.metadata or {}).get(\"gpu\"), existing.arch)", "        why = None",
     "tests/cli/test_cli.py::test_import_refuses_to_replace_another_gpu_models_cache"),
    ("complete-entry refusal", "autotune_cache/tree/writer.py",
     "        if existing.complete_for(list(staged.digests)):\n            return \"a different complete entry", "        if False:\n            return \"a different complete entry",
     "tests/cli/test_cli.py::test_import_refuses_different_complete_entry_without_force"),
    ("dead-owner check", "autotune_cache/tree/locks.py",
     "    lock = try_lock(path)\n    if lock is None:\n        yield False\n        return\n", "    lock = try_lock(path)\n    if lock is None:\n        yield True\n        return\n",
     "tests/tree/test_reliability.py::test_a_live_writers_staging_is_never_removed"),
    ("roll-forward conflict", "autotune_cache/tree/recovery.py",
     "            elif now_stage == row[\"stage_ino\"] and now_target == row[\"old_ino\"]:", "            elif now_stage == row[\"stage_ino\"]:",
     "tests/tree/test_reliability.py::test_recovery_keeps_an_entry_rewritten_after_the_kill"),
    ("import: a refused import takes its new dirs away", "autotune_cache/tree/txn.py",
     "        if self.created is not None:\n", "        if False:\n",
     "tests/engines/test_vllm_layout.py::test_an_archive_of_the_other_layout_is_refused_with_the_right_flag_and_leaves_no_tree"),
    ("import: a writer makes the tree again if a refused import took it", "autotune_cache/tree/locks.py",
     "lambda: (make_base and make_base(), ensure_tree_dirs", "lambda: (None, ensure_tree_dirs",
     "tests/cli/test_cli.py::test_a_refused_import_taking_its_empty_tree_away_does_not_break_a_concurrent_one"),
    ("import: only the dirs it made, resolved as the kernel does", "autotune_cache/tree/txn.py",
     "os.path.realpath(self.base / LOCKS_DIRNAME / \"owners\")", "str((self.base / LOCKS_DIRNAME / \"owners\").absolute())",
     "tests/engines/test_vllm_layout.py::test_an_archive_of_the_other_layout_is_refused_with_the_right_flag_and_leaves_no_tree"),
    ("careful: floor against the default", "autotune_cache/tune/quality.py",
     "        if gain < threshold:\n", "        if False:\n",
     "tests/tune/test_quality.py::test_careful_keeps_the_default_under_the_threshold"),
    ("careful: one key per lookup", "autotune_cache/tune/quality.py",
     "            out.pop(rec.key, None)\n", "            pass\n",
     "tests/tune/test_quality.py::test_careful_with_two_runners_writes_one_key_per_slot"),
    ("warm: one run per work dir", "autotune_cache/tune/workdir.py",
     "        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n", "        pass\n",
     "tests/tune/test_warm_orchestration.py::test_a_second_warm_of_the_same_target_is_refused_while_one_runs"),
    ("fleet: a target gets its own buckets only", "autotune_cache/tune/fleetrun.py",
     "                for b in op[\"buckets\"]:\n                    recs = records[g].get(b)", "                for b in records[g]:\n                    recs = records[g].get(b)",
     "tests/tune/test_fleet.py::test_a_target_gets_only_its_own_buckets_of_a_shared_call"),
    ("fleet: two targets of one entry refused", "cli/targetscmd.py",
     "        if plan.autotunes and plan.entry_id in seen:\n", "        if False:\n",
     "tests/tune/test_fleet.py::test_a_target_gets_only_its_own_buckets_of_a_shared_call"),
    ("fleet: complete entries are kept", "autotune_cache/tune/commit.py",
     "        complete=existing.complete_for(plan.rank_files),\n",
     "        complete=False,\n",
     "tests/tune/test_fleet.py::test_warm_targets_tunes_identical_calls_once_and_writes_what_warm_alone_writes"),
    ("unreadable never deleted", "autotune_cache/tree/delete.py",
     "        if e.status == EntryStatus.UNREADABLE:\n            picked_unreadable.append(e)\n            continue\n", "",
     "tests/tree/test_reliability.py::test_unreadable_entries_are_reported_and_skipped"),
    ("no-GPU staleness refusal", "autotune_cache/autotuner/fingerprint.py",
     "    if fp.has_gpu:\n        return fp\n", "    return fp\n",
     "tests/cli/test_cli.py::test_no_gpu_host_never_calls_a_cache_stale"),
    ("unknown target field", "autotune_cache/autotuner/fingerprint.py",
     "            (mismatched if is_known(target) else unknown)[name] = (value, target)", "            mismatched[name] = (value, target)",
     "tests/tree/test_scan.py::test_stale_only_on_a_definite_mismatch"),
    ("unused-for unknown", "autotune_cache/tree/select.py",
     "            if e.last_used is None or now - e.last_used < self.unused_for.seconds:", "            if e.last_used is not None and now - e.last_used < self.unused_for.seconds:",
     "tests/tree/test_reliability.py::test_unused_for_selects_nothing_where_atime_is_not_kept"),
    ("keep-latest complete first", "autotune_cache/tree/select.py",
     "        group.sort(key=lambda e: (_status_rank(e), prefer_version", "        group.sort(key=lambda e: (0, prefer_version",
     "tests/cli/test_cli.py::test_keep_latest_groups_by_deployment_and_prefers_complete"),
    ("all-or-nothing refusal", "autotune_cache/tree/txn.py",
     "                if refused:\n                    return CommitResult((), (), tuple(refused))\n", "",
     "tests/tree/test_reliability.py::test_a_refusal_found_under_the_lock_writes_nothing"),
    ("bounded sizes", "autotune_cache/plan/topology.py",
     "            if value > MAX_PARALLEL:", "            if False:",
     "tests/tree/test_layout.py::test_sizes_from_data_are_bounded"),
    ("whole names: an sglang key", "autotune_cache/engines/sglang/layout.py",
     'KEY_RE = re.compile(r"^[0-9a-f]{16}\\Z")', 'KEY_RE = re.compile(r"^[0-9a-f]{16}$")',
     "tests/tree/test_exact_names.py::test_a_newline_look_alike_is_neither_listed_nor_deleted_in_its_place"),
    ("whole names: a vLLM hash", "autotune_cache/engines/vllm/layout.py",
     'HASH_RE = re.compile(r"^[0-9a-f]{64}\\Z")', 'HASH_RE = re.compile(r"^[0-9a-f]{64}$")',
     "tests/tree/test_exact_names.py::test_every_level_of_every_layout_takes_whole_names_only"),
    ("whole names: a v2 environment", "autotune_cache/engines/flashinfer_v2/layout.py",
     'ENV_RE = re.compile(r"^[0-9a-f]{16}\\Z")', 'ENV_RE = re.compile(r"^[0-9a-f]{16}$")',
     "tests/tree/test_exact_names.py::test_every_level_of_every_layout_takes_whole_names_only"),
    ("whole names: a rank file", "autotune_cache/plan/topology.py",
     '\\.json\\Z"\n)', '\\.json$"\n)',
     "tests/tree/test_exact_names.py::test_rank_file_names_are_whole"),
    ("a bare number is no duration (a slip never deletes)", "autotune_cache/humanize.py",
     "    if not unit:\n", "    unit = unit or \"s\"\n    if False:\n",
     "tests/cli/test_ux.py::test_a_bare_number_is_a_usage_error_suggesting_days"),
    ("an inferred topology is never complete", "autotune_cache/tree/entry_scan.py",
     "    if inferred:\n        notes.append(INFERRED_NOTE)\n", "    if False:\n        notes.append(INFERRED_NOTE)\n",
     "tests/cli/test_ux.py::test_an_inferred_topology_is_never_complete"),
    ("an unverified entry holding every rank is not replaced", "autotune_cache/tree/records.py",
     "        return self.status == EntryStatus.UNVERIFIED and bool(expected) and all(", "        return False and all(",
     "tests/cli/test_ux.py::test_an_unverified_entry_holding_every_rank_is_not_replaced_without_force"),
    ("an unverified entry short of a rank is not complete for its reader", "autotune_cache/tree/records.py",
     "and bool(expected) and all(n in names for n in expected)", "or True",
     "tests/cli/test_ux.py::test_an_unverified_entry_holding_every_rank_is_not_replaced_without_force"),
    ("keep-latest keeps the installed version first", "autotune_cache/tree/select.py",
     "(_status_rank(e), prefer_version is None or e.flashinfer_version != prefer_version)", "_status_rank(e)",
     "tests/cli/test_ux.py::test_keep_latest_keeps_the_installed_version_over_a_later_touched_older_one"),
    ("keep-latest ranks the newest version over the newest touch", "autotune_cache/tree/select.py",
     "        group.sort(key=lambda e: version_order(e.flashinfer_version), reverse=True)\n", "        pass\n",
     "tests/cli/test_ux.py::test_keep_latest_prefers_the_env_from_version_then_the_newest"),
    ("pull: a bundle holds only the entry its record names", "autotune_cache/tree/pull.py",
     "    if plan.entries != {rec.id}:\n", "    if False:\n",
     "tests/tree/test_pull_verify.py::test_a_bundle_carrying_a_second_entry_installs_neither[file]"),
    ("pull: a record's metadata agrees with its bundle's rank files", "autotune_cache/tree/pull.py",
     "    if bundle_metadata(staged) != rec.metadata:\n", "    if False:\n",
     "tests/tree/test_pull_verify.py::test_a_record_edited_to_another_environment_does_not_install[file-empty]"),
    ("pull: a bundle's rank files share one environment", "autotune_cache/tree/pull.py",
     "    if staged.mixed_metadata:\n", "    if False:\n",
     "tests/tree/test_pull_verify.py::test_a_bundle_whose_rank_files_disagree_is_refused[file]"),
    ("pull: a record counts its bundle's rank files", "autotune_cache/tree/pull.py",
     "    if rec.rank_files and rec.rank_files != len(staged.records):\n", "    if False:\n",
     "tests/tree/test_pull_verify.py::test_a_record_counting_other_rank_files_than_its_bundle_is_refused[file]"),
    ("pull: the bundles are checked before the commit", "autotune_cache/tree/archive.py",
     "        if check is not None:\n            check(plans, txn)\n", "",
     "tests/tree/test_pull_verify.py::test_a_record_for_one_entry_naming_another_entrys_bundle_is_refused[file]"),
    ("pull: a record in another entry's place", "autotune_cache/tree/store.py",
     "        if rec.layout != layout or rec.id != eid:\n", "        if False:\n",
     "tests/tree/test_pull_verify.py::test_a_record_copied_to_another_entrys_place_is_refused[file]"),
    ("store: a record listed only at its own entry's place", "autotune_cache/tree/store.py",
     "                if p != self.record_path(rec.layout, rec.id):\n", "                if False:\n",
     "tests/tree/test_pull_verify.py::test_a_record_copied_to_another_entrys_place_is_refused[file]"),
    ("store: an unreadable marker may be sealed: no push", "autotune_cache/tree/store.py",
     "        if \"unreadable\" in marker:\n            raise FiAutotuneError(", "        if False:\n            raise FiAutotuneError(",
     "tests/tree/test_store_limits.py::test_a_sealed_store_with_an_unreadable_marker_is_never_written[file-truncated]"),
    ("store: a marker must have its fields", "autotune_cache/tree/store.py",
     " or type(d.get(\"format\")) is not int or type(d.get(\"read_only\")) is not bool:", ":",
     "tests/tree/test_store_limits.py::test_a_sealed_store_with_an_unreadable_marker_is_never_written[file-not-a-marker]"),
    ("store: a local record or marker is read with its cap", "autotune_cache/tree/storeio.py",
     "            return read_regular_file(path, limit=limit)\n", "            return read_regular_file(path, limit=1 << 40)\n",
     "tests/tree/test_store_limits.py::test_a_600_mb_record_and_marker_on_a_file_store_are_refused_unread"),
    ("convert: no blocking read of a FIFO in a v2 entries dir", "autotune_cache/engines/flashinfer_v2/store.py",
     "                    if read_regular_file(path, limit=len(data)) == data:\n", "                    if path.read_bytes() == data:\n",
     "tests/engines/test_v2_fifo.py::test_convert_replaces_a_fifo_in_entries_instead_of_hanging"),
]


def main() -> None:
    only = sys.argv[1:]
    results = []
    for name, rel, old, new, test in MUTATIONS:
        if only and not any(o in name for o in only):
            continue
        p = REPO / rel
        src = p.read_text()
        if src.count(old) != 1:
            results.append((name, f"SNIPPET NOT FOUND ({src.count(old)})"))
            continue
        p.write_text(src.replace(old, new))
        try:
            # one process (-n0), and no marker filter (-m ""): a deselected test exits non-zero too
            r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-n0", "-m", "", "-p", "no:warnings", test],
                               cwd=REPO, capture_output=True, text=True, timeout=900)
            results.append((name, "caught" if r.returncode != 0 else "NOT CAUGHT"))
        finally:
            p.write_text(src)
    for name, verdict in results:
        print(f"{verdict:<12} {name}")
    sys.exit(0 if all(v == "caught" for _, v in results) else 1)


if __name__ == "__main__":
    main()
