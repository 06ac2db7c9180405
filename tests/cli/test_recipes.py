"""The image recipes gate what ships (issue 45): every recipe that builds an image from
``fi-autotune export`` runs ``check --strict`` on the bundle as the Dockerfile's ``ADD`` extracts it,
not on the tree it was exported from.

``export`` packs complete entries only. An entry the engine wrote itself (rank files, no
manifest) in ``./sglang-cache`` - which ``pull`` leaves in place when its files are the store's -
is used by an engine reading that tree, so ``check`` there passes; ``export`` skips it with one line
on stderr and exits 0 when it packed anything else; an image built from the bundle lacks it. So
the recipes check the extracted bundle, and this file runs each of them as written:

* the README's recipe block and docs/deploy.md's ``# recipe:`` blocks that export, taken from the
  markdown at test time; only what cannot run here is substituted: the README's
  ``s3://bucket/caches`` by a bucket of a real S3 server on loopback (moto), and the GPU steps
  (``fi-autotune env``, ``warm``) by tests/standins/deploy_steps.py, which writes the entry ``warm``
  would write (``docker build`` is not run: the recipes' shell lines are the build machine's);
* as written they pass; with an engine-written entry of the recipe's target in ``./sglang-cache``
  (alone, or beside a complete entry so that ``export`` exits 0) the gate exits non-zero, one clear
  line per miss, no traceback;
* the GitHub Actions workflow (YAML, not run) says step for step what its shell recipe runs.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ..conftest import GPU_STEPS, REPO
from ..support.zygotes import cli_on_path

README = REPO / "README.md"
DEPLOY = REPO / "docs" / "deploy.md"
FLEET = REPO / "docs" / "fleet.md"
#: the manifest fi-autotune writes beside an entry's rank files (the engine writes none); README "The cache layout"
MANIFEST = "fi-autotune.manifest.json"
#: the README's store, which only exists on a reader's account
README_STORE = "s3://bucket/caches"

SHELL_BLOCK_RE = re.compile(r"```bash\n(.*?)```", re.S)
RECIPE_RE = re.compile(r"^# recipe: (?P<name>[\w-]+) (?P<step>\d+)/(?P<steps>\d+) \((?P<where>[^)]*)\)\n")
STANDIN = ('fi-autotune() { case "$1" in env|warm) "$FI_GPU_STEPS" "$@";; '
           '*) command fi-autotune "$@";; esac; }\n')


# -- the recipes, from the markdown -------------------------------------------------------------

def shell_blocks(doc: Path) -> list[str]:
    return SHELL_BLOCK_RE.findall(doc.read_text())


def image_recipes() -> dict[str, list[tuple[bool, str]]]:
    """Each recipe that exports a bundle: name -> [(runs on the GPU box, shell text), ...] in order."""
    out: dict[str, list[tuple[bool, str]]] = {}
    readme = [b for b in shell_blocks(README) if "fi-autotune export" in b]
    assert len(readme) == 1, "the README's recipe block (the one that exports) is not found, or not one"
    out["readme"] = [(True, readme[0])]  # one block, GPU box and build machine: only env and warm are stood in for
    for block in shell_blocks(DEPLOY):
        m = RECIPE_RE.match(block)
        if m:
            where = m["where"]
            out.setdefault(f"deploy-{m['name']}", []).append(("GPU" in where and "no GPU" not in where, block))
    return {name: blocks for name, blocks in out.items() if any("fi-autotune export" in b for _, b in blocks)}


RECIPES = image_recipes()


def warm_args(blocks: list[tuple[bool, str]]) -> list[str]:
    """The arguments of the recipe's own ``fi-autotune warm`` line (the entry its image must carry)."""
    text = "\n".join(b for _, b in blocks).replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.lstrip().startswith("fi-autotune warm "))
    return shlex.split(line.split("&&")[0].split("#")[0])[2:]


def test_the_image_recipes_are_found():
    """If a recipe is renamed or loses its export, this says so, rather than testing nothing."""
    assert set(RECIPES) == {"readme", "deploy-docker", "deploy-github-actions"}


@pytest.mark.parametrize("doc", [README, DEPLOY, FLEET], ids=lambda p: p.name)
def test_every_gate_after_an_export_checks_the_extracted_bundle(doc):
    """In every shell block: a ``check --strict`` after ``export -o BUNDLE`` reads the directory
    BUNDLE was extracted into (``tar xzf BUNDLE -C DIR``, as ``ADD`` does), never the exported tree."""
    for block in shell_blocks(doc):
        text = block.replace("\\\n", " ")
        exported = re.search(r"fi-autotune export\b.*?-o (\S+).*?--cache-dir (\S+)", text)
        if not exported or "check --strict" not in text:
            continue
        bundle, source = exported.groups()
        after = text[exported.end():]
        extracted = re.search(rf"tar xzf {re.escape(bundle)} -C (\S+)", after)
        assert extracted, f"{doc.name}: {bundle} is never extracted before the gate:\n{block}"
        gates = re.findall(r"check --strict\b.*?--cache-dir (\S+)", after)
        assert gates and all(g == extracted[1] for g in gates), \
            f"{doc.name}: the gate checks {gates}, not the extracted bundle {extracted[1]} (exported from {source})"
        assert not re.search(rf"check --strict\b.*?--cache-dir {re.escape(source)}", text), doc.name


# -- running them ---------------------------------------------------------------------------------

def _env(s3: dict, work: Path) -> dict:
    """The recipe shell's environment: the recipe's ``fi-autotune`` lines and the GPU steps' stand-in
    (STANDIN, ``$FI_GPU_STEPS``) are forked by the test process's CLI fork server (``cli_on_path``:
    the installed console script and the stand-in script, a real process each)."""
    bindir = str(Path(sys.executable).parent)
    return {**os.environ, **s3["env"], "STORE": s3["url"],
            "PATH": f"{bindir}:{os.environ['PATH']}",
            "SGLANG_CACHE_DIR": str(work / "gpu-box-cache"),  # the GPU box's engine root; the build uses ./sglang-cache
            "TMPDIR": str(work)}  # the recipes' `mktemp -d` (the extracted bundle) stays in the test's own directory


def run_recipe(name: str, s3: dict, work: Path) -> subprocess.CompletedProcess:
    """Every block of the recipe, in order, as written (``set -euo pipefail``: a failing line fails
    the block, as a failing ``RUN`` or CI step fails the build); the first failing block's result."""
    out, err = [], []
    proc = None
    with cli_on_path(_env(s3, work), GPU_STEPS) as env:
        for gpu, block in RECIPES[name]:
            script = "set -euo pipefail\n" + (STANDIN if gpu else "") + block.replace(README_STORE, s3["url"])
            proc = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=600)
            out.append(proc.stdout)
            err.append(proc.stderr)
            if proc.returncode:
                break
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(out), "".join(err))


def engine_written(name: str, s3: dict, work: Path) -> str:
    """Put in ``./sglang-cache`` the recipe target's rank files as the engine leaves them: the
    same bytes ``warm`` writes for it (so ``pull`` finds them unchanged), plain files, no manifest.
    Returns the entry's id."""
    scratch = work / "engine-scratch"
    proc = subprocess.run([sys.executable, "-m", "tests.standins.deploy_steps", "warm", *warm_args(RECIPES[name]),
                           "--cache-dir", str(scratch)], cwd=REPO, env={**_env(s3, work), "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    base = scratch / "flashinfer" / "autotune"
    (entry,) = [p for p in base.glob("[!.]*/*/*") if p.is_dir()]  # not our journal and lock dirs
    target = work / "sglang-cache" / entry.relative_to(scratch)
    target.mkdir(parents=True)
    for f in entry.iterdir():
        if f.name != MANIFEST:
            target.joinpath(f.name).write_bytes(f.read_bytes())
    shutil.rmtree(scratch)
    return str(entry.relative_to(base))


def another_complete_entry(work: Path) -> str:
    """A complete entry (another model) beside it: ``export`` then packs something and exits 0."""
    from devtools.synthetic import write_fake_entry

    return str(write_fake_entry(work / "sglang-cache"))


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_as_written_passes(name, s3, tmp_path):
    proc = run_recipe(name, s3, tmp_path)
    assert proc.returncode == 0, f"{name}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr
    assert (tmp_path / "caches.tgz").is_file()
    assert re.search(r"^OK: /\S+/flashinfer/autotune/\S+: 2 rank files", proc.stdout, re.M), proc.stdout


@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside-a-complete-entry"])
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_engine_written_entry_fails_the_gate(name, beside, s3, tmp_path):
    """The entry the image must carry is in ./sglang-cache without a manifest: whatever ``export``
    does with the rest, the build fails, one line per miss, no traceback."""
    eid = engine_written(name, s3, tmp_path)
    if beside:
        another_complete_entry(tmp_path)
    proc = run_recipe(name, s3, tmp_path)
    assert proc.returncode != 0, f"{name}: the gate passed an image without {eid}:\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    assert f"unchanged  {eid}" in proc.stdout  # pull left the engine's entry as it was
    assert f"skipping {eid}: unverified" in proc.stderr  # export said so, in one line
    if beside:
        # export packed the other entry and exited 0: it is check, on the bundle, that fails the build
        assert "Exported 1 entry" in proc.stdout, proc.stdout
        assert "MISS: no entry at " in proc.stdout and eid in proc.stdout, proc.stdout
        assert proc.returncode == 1
    else:
        assert proc.stderr.rstrip().endswith("fi-autotune: error: nothing to export"), proc.stderr


def test_check_on_the_live_tree_still_means_the_engine_uses_it(s3, tmp_path):
    """``check`` on ./sglang-cache answers "will the engine reading this tree use it": yes (exit 0
    under --strict), with one warning that ``export`` skips the entry."""
    name = "deploy-github-actions"
    eid = engine_written(name, s3, tmp_path)
    block = RECIPES[name][-1][1]
    gate = next(ln for ln in block.splitlines() if "check --strict" in ln)
    live = re.sub(r'--cache-dir "\$shipped"', "--cache-dir ./sglang-cache", gate)
    assert live != gate
    with cli_on_path(_env(s3, tmp_path), GPU_STEPS) as env:
        proc = subprocess.run(["bash", "-c", STANDIN + "fi-autotune env --json > env.json\n" + live], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("OK: "), proc.stdout
    warnings = [ln for ln in proc.stderr.splitlines() if "`export` and `push` skip it" in ln]
    assert len(warnings) == 1 and eid in warnings[0] and "no fi-autotune manifest" in warnings[0], proc.stderr
    assert "Traceback" not in proc.stderr


# -- the workflow says what its shell recipe runs ----------------------------------------------------

def _workflow() -> dict:
    for m in re.finditer(r"```yaml\n(.*?)```", DEPLOY.read_text(), re.S):
        doc = yaml.safe_load(m.group(1))
        if isinstance(doc, dict) and "jobs" in doc:
            return doc
    raise AssertionError("no GitHub Actions workflow in docs/deploy.md")


def _commands(lines: list[str]) -> list[str]:
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


@pytest.mark.parametrize("job, step", [("warm", 1), ("image", 2)])
def test_workflow_runs_its_shell_recipe(job, step):
    """docs/deploy.md's workflow is documented, not run: each job's ``run:`` lines are the shell
    recipe's lines, in order (the artifact's upload and download are its copies)."""
    runs = [s["run"] for s in _workflow()["jobs"][job]["steps"] if "run" in s]
    workflow = _commands([ln for r in runs for ln in r.splitlines()])
    workflow = [ln for ln in workflow if not ln.startswith("pip install")]
    block = RECIPES["deploy-github-actions"][step - 1][1]
    recipe = [ln for ln in _commands(block.splitlines()) if "artifact" not in ln]
    assert workflow == recipe
