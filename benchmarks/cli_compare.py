"""Old-vs-new comparison of what the ``fi-autotune`` command line does (issue 33's refactor moves
most modules of ``autotune_cache/`` and ``cli/``; "done" means no command behaves differently).

    python benchmarks/cli_compare.py --old main --new /work/wt-x --out RESULT_DIR [--jobs 2]

Each side is a checkout with its own venv (``<dir>/.venv/bin/fi-autotune``). ``--old`` may be a
git ref instead: a detached worktree and venv are made under ``/tmp/clicmp-sides/<sha>`` (reused
when present). A few hundred commands (discovered ``--help`` pages, ``plan`` over every preset and
topology, serving commands, the tree commands on synthetic and warmed trees, ``doctor`` over the
engine-log fixtures, bad input) each run in ``/tmp/clicmp/case-N``, recreated from the same
fixture bytes before every run, so absolute paths in outputs are the same on both sides; the
environment is fixed (HOME and XDG dirs in the case dir, TZ=UTC, COLUMNS=120, no GPU, HF offline).

Compared: exit code, stdout, stderr, and every file left in the case dir (relative path, kind,
sha256). What is volatile (timestamps, pids, durations) is not guessed: the OLD side runs each
command twice, and whatever differs between those two runs is ignored - a JSON field (by its
path, in files and in ``--json`` stdout), a text line (by its number, when both runs printed as
many lines), a non-JSON file's bytes (its presence still counts). Nothing else is normalised.
A command whose two old runs differ beyond that is reported as "unstable", not hidden.

The fixtures are built once per kind, by the OLD side's python and its own test helpers (the
synthetic writer, the fake-GPU launcher), then copied (bytes and times) into each case dir.

Output: a table by command family on stdout and in ``RESULT_DIR/cli_compare.json``, one unified
diff per differing command in ``RESULT_DIR/diffs/``. Exit 1 if anything differs.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# --- the project's own helpers the fixtures are built with (paths inside a checkout). Issue 33
# may move them: these four lines are the only references.
SYNTHETIC_MODULE = "tests.synthetic"          # write_fake_entry, write_vllm_entry, DEFAULT_METADATA
FAKE_GPU_CLI = "tests/_fake_gpu_cli.py"       # `python FAKE_GPU_CLI warm ...` on stand-in GPUs
ENGINE_LOGS = "tests/data/engine_logs"        # doctor's fixtures (*.log)
TORCH_PIN = "torch==2.13.0"                   # what a fresh side's venv installs first (preamble)

REPO = Path(__file__).resolve().parent.parent
BASE = Path("/tmp/clicmp")                    # case dirs: same absolute paths on both sides
SIDES_DIR = Path("/tmp/clicmp-sides")         # worktrees + venvs made for a git ref
CMD_TIMEOUT = 180


@dataclass(frozen=True)
class Side:
    """One checkout: where it is, its ``fi-autotune`` and its python."""
    label: str
    root: Path

    @property
    def bin(self) -> Path:
        return self.root / ".venv" / "bin"


def sh(argv: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], check=True, text=True, capture_output=True, **kw)


def prepare_side(spec: str, label: str) -> Side:
    """A directory is used as it is; anything else is a git ref of this repository, checked out
    (detached) with a venv under SIDES_DIR, once."""
    path = Path(spec).expanduser()
    if not path.is_dir():
        sha = sh(["git", "-C", REPO, "rev-parse", "--verify", f"{spec}^{{commit}}"]).stdout.strip()
        path = SIDES_DIR / sha[:12]
        if not (path / ".git").exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            print(f"[{label}] git worktree add {path} {sha[:12]}", file=sys.stderr)
            sh(["git", "-C", REPO, "worktree", "add", "--detach", path, sha])
    side = Side(label, path.resolve())
    if not (side.bin / "fi-autotune").exists():
        print(f"[{label}] making {side.root}/.venv (pip install {TORCH_PIN}, -e .)", file=sys.stderr)
        sh([sys.executable, "-m", "venv", side.root / ".venv"])
        sh([side.bin / "pip", "install", "-q", TORCH_PIN])
        sh([side.bin / "pip", "install", "-q", "-e", side.root])
    return side


def case_env(case_dir: Path, side: Side) -> dict[str, str]:
    """The whole environment a command sees: nothing from the caller's shell leaks in."""
    home = case_dir / "home"
    return {
        "PATH": f"{side.bin}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "USER": "clicmp",
        "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local/share"), "XDG_STATE_HOME": str(home / ".local/state"),
        "TMPDIR": str(case_dir / "tmp"), "TZ": "UTC", "COLUMNS": "120", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
        "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(home / ".cache/huggingface"), "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
    }


# --- fixtures: built once per kind by the OLD side, then copied into every case dir -------------

#: Run by the old side's python in the old checkout: ``python -c SETUP_TREE DEST``. Entries of
#: several keys, versions, arches and statuses, one vLLM entry, fingerprints for --env-from.
SETUP_TREE = f"""
import json, sys
from pathlib import Path
from {SYNTHETIC_MODULE} import DEFAULT_METADATA, default_fields, entry_path, write_fake_entry, write_vllm_entry
from autotune_cache.plan.topology import Topology
dest = Path(sys.argv[1])
tree = dest / "tree"
write_fake_entry(tree)
write_fake_entry(tree, default_fields(tp=2, dp=1), arch="sm90", seed=1)
write_fake_entry(tree, default_fields(model="Qwen/Qwen3-30B-A3B", tp=4, dp=1, ep=4), flashinfer_version="0.7.1", seed=2)
write_fake_entry(tree, default_fields(model="org/no-manifest", tp=2, dp=1), with_manifest=False, seed=3)
torn = write_fake_entry(tree, default_fields(model="org/corrupt", tp=2, dp=1), seed=4)
rank = sorted(entry_path(tree, torn).glob("rank_*.json"))[0]
rank.write_bytes(rank.read_bytes()[:100])
write_fake_entry(tree, default_fields(model="org/other-gpu", tp=1, dp=1), seed=5, metadata={{"gpu": "NVIDIA H100 80GB HBM3"}})
write_vllm_entry(dest / "vllm", "0123456789abcdef", world=2)
(dest / "h200.json").write_text(json.dumps({{"format": 1, "fingerprint": DEFAULT_METADATA}}))
(dest / "h100.json").write_text(json.dumps({{"fingerprint": {{**DEFAULT_METADATA, "gpu": "NVIDIA H100 80GB HBM3"}}}}))
(dest / "bad-env.json").write_text('{{"gpu": "x"}}')
(dest / "not-json.json").write_text("this is not json")
"""

#: The warm through the fake-GPU launcher: a tree written by the real orchestrator.
WARM_ARGS = ["--model", "Qwen/Qwen3-30B-A3B", "--moe-runner-backend", "flashinfer_cutlass", "--arch", "sm90",
             "--flashinfer-version", "0.7.2.post1", "--tp", "2"]


def build_fixtures(old: Side, kind: str, dest: Path) -> None:
    """``dest`` gets the fixture files of ``kind`` (its home, logs and trees)."""
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "home").mkdir(parents=True)
    (dest / "tmp").mkdir()
    shutil.copytree(old.root / ENGINE_LOGS, dest / "logs", ignore=shutil.ignore_patterns("*.py", "*.md"))
    env = case_env(dest, old)
    py = [old.bin / "python"]
    if kind == "tree":
        sh([*py, "-c", SETUP_TREE, dest], cwd=old.root, env=env)
        sh([old.bin / "fi-autotune", "export", "-o", dest / "tree.tar.gz", "--cache-dir", dest / "tree"], cwd=dest, env=env)
        sh([old.bin / "fi-autotune", "push", f"file://{dest}/store", "--cache-dir", dest / "tree"], cwd=dest, env=env)
    elif kind == "warm":
        sh([*py, old.root / FAKE_GPU_CLI, "warm", *WARM_ARGS, "--cache-dir", dest / "warm"], cwd=old.root, env=env)


def restore(fixture: Path, case_dir: Path) -> None:
    """The case dir, fresh, with the fixture's bytes and times."""
    if case_dir.exists():
        shutil.rmtree(case_dir)
    shutil.copytree(fixture, case_dir, symlinks=True)


# --- one run: what a command did ----------------------------------------------------------------

def read_json(data: bytes):
    """The parsed value of a JSON document or of JSON lines; None for anything else."""
    if not data.strip()[:1] in (b"{", b"["):
        return None
    try:
        return json.loads(data)
    except ValueError:
        pass
    try:
        return [json.loads(line) for line in data.splitlines() if line.strip()]
    except ValueError:
        return None


def files_of(case_dir: Path) -> dict[str, list]:
    """Every path under the case dir: ``[kind, sha256 or link target]``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(case_dir):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            rel = str(p.relative_to(case_dir))
            if p.is_symlink():
                out[rel] = ["link", os.readlink(p)]
            elif p.is_dir():
                out[rel] = ["dir", ""]
            else:
                out[rel] = ["file", hashlib.sha256(p.read_bytes()).hexdigest()]
    return out


def run_once(side: Side, argv: list[str], case_dir: Path, fixture: Path) -> dict:
    """Restore the case dir, run ``fi-autotune ARGV`` in it, and record everything it did."""
    restore(fixture, case_dir)
    t0 = time.monotonic()
    try:
        proc = subprocess.run([str(side.bin / "fi-autotune"), *argv], cwd=case_dir, env=case_env(case_dir, side),
                              capture_output=True, stdin=subprocess.DEVNULL, timeout=CMD_TIMEOUT)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, stdout, stderr = "timeout", e.stdout or b"", e.stderr or b""
    files = files_of(case_dir)
    contents = {rel: (case_dir / rel).read_bytes() for rel, (kind, _) in files.items() if kind == "file"}
    return {"rc": rc, "stdout": stdout, "stderr": stderr, "files": files, "contents": contents,
            "seconds": time.monotonic() - t0}


# --- comparing: ignore only what the old side itself did not reproduce --------------------------

def flatten(value, prefix: tuple = ()) -> dict[tuple, object]:
    if isinstance(value, dict) and value:
        return {k: v for key, item in value.items() for k, v in flatten(item, (*prefix, key)).items()}
    if isinstance(value, list) and value:
        return {k: v for i, item in enumerate(value) for k, v in flatten(item, (*prefix, i)).items()}
    return {prefix: json.dumps(value, sort_keys=True)}


def compare_bytes(a1: bytes | None, a2: bytes | None, b: bytes | None) -> tuple[str, list]:
    """``("same" | "differs" | "unstable", ignored)`` for one stream or file: old run 1, old run 2,
    new. JSON: the fields whose values the two old runs disagree on are ignored; text: the lines
    they disagree on (same line count); other bytes: their content, when the old runs disagree."""
    if a1 == b and a1 == a2:
        return "same", []
    if a1 is None or b is None or a2 is None:
        return ("differs" if a1 == a2 else "unstable"), []
    j1, j2, jb = read_json(a1), read_json(a2), read_json(b)
    if j1 is not None and j2 is not None:
        f1, f2 = flatten(j1), flatten(j2)
        volatile = {k for k in f1.keys() | f2.keys() if f1.get(k) != f2.get(k)}
        if jb is None:
            return "differs", sorted(map(str, volatile))
        fb = flatten(jb)
        keys = (f1.keys() | fb.keys()) - volatile
        return ("same" if all(f1.get(k) == fb.get(k) for k in keys) else "differs"), sorted(map(str, volatile))
    if a1 == a2:
        return "differs", []
    if not (is_text(a1) and is_text(a2)):
        return "same", ["(bytes)"]  # binary bytes that vary run to run: only their presence is compared
    l1, l2, lb = a1.splitlines(), a2.splitlines(), b.splitlines()
    if len(l1) != len(l2):
        return "unstable", ["(line count)"]
    volatile = [i for i, (x, y) in enumerate(zip(l1, l2)) if x != y]
    if len(lb) != len(l1):
        return "differs", [f"line {i + 1}" for i in volatile]
    same = all(x == y for i, (x, y) in enumerate(zip(l1, lb)) if i not in volatile)
    return ("same" if same else "differs"), [f"line {i + 1}" for i in volatile]


def is_text(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\0" not in data


def compare_runs(o1: dict, o2: dict, new: dict) -> dict:
    """Each part of the three runs: its verdict and what was ignored."""
    parts = {"rc": ("same" if o1["rc"] == new["rc"] else "unstable" if o1["rc"] != o2["rc"] else "differs", [])}
    for stream in ("stdout", "stderr"):
        parts[stream] = compare_bytes(o1[stream], o2[stream], new[stream])
    for rel in sorted(o1["files"].keys() | o2["files"].keys() | new["files"].keys()):
        k1, k2, kb = (r["files"].get(rel, ["absent"])[0] for r in (o1, o2, new))
        if k1 != kb or k1 != k2:
            parts[rel] = ("differs" if k1 == k2 else "unstable", [])
        elif k1 == "file":
            parts[rel] = compare_bytes(o1["contents"][rel], o2["contents"][rel], new["contents"][rel])
        elif o1["files"][rel] != new["files"][rel]:
            parts[rel] = ("differs" if o1["files"][rel] == o2["files"][rel] else "unstable", [])
    return {name: v for name, v in parts.items() if v != ("same", [])}
