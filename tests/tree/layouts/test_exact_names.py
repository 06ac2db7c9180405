"""Names are matched whole, in every layout: a directory or file whose name is a real one plus a
trailing newline, padded with a space, or spelled with non-ASCII digits is never an entry, a rank
file or one of fi-autotune's own temp/stage/trash names (``re.match`` with ``$`` accepts a
trailing ``\\n``: ``ls -q`` would print such an id exactly like the real one, and
``ls -q --status corrupt | xargs fi-autotune rm -y`` would then delete the real entry)."""

from __future__ import annotations

import shutil

import pytest

from autotune_cache import registry
from autotune_cache.engines.vllm.layout import VllmRankName
from autotune_cache.plan.topology import RankName
from autotune_cache.tree.layouts.own_names import STAGE_DIR_RE, TEMP_FILE_RE, TRASH_DIR_RE
from devtools.synthetic import entry_path, write_fake_entry

from tests.conftest import run_cli

SAMPLES = ("0.7.2.post1", "sm90", "sm100", "90a", "100a_90a", "0123456789abcdef", "ab" * 32)


def _spoiled(name: str) -> list[str]:
    out = [name + "\n", " " + name, name + " ", "\n" + name]
    if any(c.isdigit() for c in name):
        i = next(i for i, c in enumerate(name) if c.isdigit())
        out.append(name[:i] + chr(0x0660 + int(name[i])) + name[i + 1:])  # ARABIC-INDIC DIGIT
    return out


@pytest.mark.parametrize("layout", list(registry.layouts()))
def test_every_level_of_every_layout_takes_whole_names_only(layout):
    for level in registry.get_layout(layout).levels:
        valid = [s for s in SAMPLES if level.pattern.match(s)]
        assert valid, f"{layout}: no sample for level {level.field}"
        for name in valid:
            for bad in _spoiled(name):
                assert not level.pattern.match(bad), f"{layout} {level.field}: {bad!r} taken for {name!r}"


@pytest.mark.parametrize("name, parse", [
    ("rank_tp0_pp0_dp0.json", RankName.parse),
    ("autotune_configs_dp0_rank1.json", VllmRankName.parse),
])
def test_rank_file_names_are_whole(name, parse):
    assert parse(name) is not None
    for bad in _spoiled(name):
        assert parse(bad) is None, bad


@pytest.mark.parametrize("name, pattern", [
    (".fi-autotune-abc.tmp", TEMP_FILE_RE),
    (".fi-autotune-stage-0123456789ab-0123456789abcdef", STAGE_DIR_RE),
    (".fi-autotune-trash-0123456789ab-0123456789abcdef", TRASH_DIR_RE),
])
def test_our_own_names_are_whole(name, pattern):
    assert pattern.match(name)
    assert not pattern.match(name + "\n")


def test_a_newline_look_alike_is_neither_listed_nor_deleted_in_its_place(tmp_path):
    root = tmp_path / "root"
    eid = write_fake_entry(root, arch="sm90")
    real = entry_path(root, eid)
    twin = real.with_name(real.name + "\n")
    shutil.copytree(real, twin)
    (twin / "rank_tp0_pp0_dp0.json").write_text("{ not json")  # a corrupt look-alike
    listed = run_cli("ls", "-q", "--cache-dir", str(root))
    assert listed.returncode == 0 and listed.stdout.splitlines() == [str(eid)], listed.stdout
    corrupt = run_cli("ls", "-q", "--status", "corrupt", "--cache-dir", str(root))
    assert corrupt.returncode == 0 and corrupt.stdout == ""
    assert real.is_dir() and twin.is_dir()
