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
SYNTHETIC_MODULE = "devtools.synthetic"          # write_fake_entry, write_vllm_entry, DEFAULT_METADATA
FAKE_GPU_CLI = "tests/standins/fake_gpu_cli.py"       # `python FAKE_GPU_CLI warm ...` on stand-in GPUs
#: Where an old checkout from before issue 33's moves keeps the same two helpers.
BEFORE_33 = {SYNTHETIC_MODULE: "tests.synthetic", FAKE_GPU_CLI: "tests/_fake_gpu_cli.py"}
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
        # the test extra: it pins the FlashInfer the checkout's goldens are of (a bare ``-e .`` takes
        # the newest 0.7.x, and every plan would differ by its version alone)
        print(f"[{label}] making {side.root}/.venv (pip install {TORCH_PIN}, -e .[test])", file=sys.stderr)
        sh([sys.executable, "-m", "venv", side.root / ".venv"])
        sh([side.bin / "pip", "install", "-q", TORCH_PIN])
        sh([side.bin / "pip", "install", "-q", "-e", f"{side.root}[test]"])
    # bytecode once, in the checkout (gitignored), not compiled again by every one of ~1,500 runs
    sh([side.bin / "python", "-m", "compileall", "-q", *(p for p in ("autotune_cache", "cli", "tests") if (side.root / p).is_dir())],
       cwd=side.root)
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
        "HF_HOME": str(home / ".cache/huggingface"), "PYTHONHASHSEED": "0",
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
    moved = not (old.root / FAKE_GPU_CLI).exists()  # an old side from before the helpers moved
    if kind == "tree":
        setup = SETUP_TREE.replace(SYNTHETIC_MODULE, BEFORE_33[SYNTHETIC_MODULE]) if moved else SETUP_TREE
        sh([*py, "-c", setup, dest], cwd=old.root, env=env)
        sh([old.bin / "fi-autotune", "export", "-o", dest / "tree.tar.gz", "--cache-dir", dest / "tree"], cwd=dest, env=env)
        sh([old.bin / "fi-autotune", "push", f"file://{dest}/store", "--cache-dir", dest / "tree"], cwd=dest, env=env)
    elif kind == "warm":
        # the stand-in GPUs are the launcher's: no CUDA_VISIBLE_DEVICES="" hiding them from --gpus
        env = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
        sh([*py, old.root / (BEFORE_33[FAKE_GPU_CLI] if moved else FAKE_GPU_CLI), "warm", *WARM_ARGS, "--cache-dir", dest / "warm"], cwd=old.root, env=env)


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
    if b == a1 or b == a2:
        return "same", []  # new did exactly what one old run did
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
    stable = o1["files"].keys() & o2["files"].keys()
    for rel in sorted(stable):
        kb = new["files"].get(rel, ["absent"])[0]
        if o1["files"][rel][0] != kb:
            parts[rel] = ("differs" if o1["files"][rel][0] == o2["files"][rel][0] else "unstable", [])
        elif kb == "file":
            parts[rel] = compare_bytes(o1["contents"][rel], o2["contents"][rel], new["contents"][rel])
        elif o1["files"][rel] != new["files"][rel]:
            parts[rel] = ("differs" if o1["files"][rel] == o2["files"][rel] else "unstable", [])
    parts.update(compare_unpaired(stable, o1, o2, new))
    return {name: v for name, v in parts.items() if v != ("same", [])}


def compare_unpaired(stable: set[str], o1: dict, o2: dict, new: dict) -> dict:
    """Paths only one old run left have names that change run to run (``tempfile.mkdtemp`` under
    TMPDIR, left by torch's and FlashInfer's imports). They cannot be paired by name, so they are
    counted: by the stable directory they sit in, their depth below it and their kind; the new
    side must leave as many as an old run did. New paths no old run left count the same way."""
    def shape(run: dict) -> dict:
        count: dict[str, int] = {}
        for rel, (kind, _) in run["files"].items():
            if rel in stable:
                continue
            parts = Path(rel).parts
            top = next(i for i in range(len(parts)) if str(Path(*parts[:i + 1])) not in stable)
            where = f"{Path(*parts[:top]) if top else '.'}/* (depth {len(parts) - top - 1}, {kind})"
            count[where] = count.get(where, 0) + 1
        return count
    s1, s2, sb = shape(o1), shape(o2), shape(new)
    out = {}
    for where in sorted(s1.keys() | s2.keys() | sb.keys()):
        a1, a2, b = s1.get(where, 0), s2.get(where, 0), sb.get(where, 0)
        if b not in (a1, a2):
            out[f"{where}: old {a1}/{a2}, new {b}"] = ("differs" if a1 == a2 else "unstable", [])
        elif a1 or a2:
            out[where] = ("same", ["(names)"])
    return out


# --- one case: old, old again, new ----------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """``fi-autotune ARGV`` (``{C}`` is the case dir) on the fixtures of ``fixture``."""
    family: str
    argv: tuple[str, ...]
    fixture: str = "tree"


def text_of(data) -> list[str]:
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace").splitlines(keepends=True)
    return [f"{data}\n"]


def diff_text(case: Case, argv: list[str], o1: dict, new: dict, parts: dict) -> str:
    """A unified diff per differing part (old run 1 against new)."""
    out = [f"# fi-autotune {' '.join(argv)}\n# fixture: {case.fixture}\n"]
    for name, (verdict, ignored) in parts.items():
        if verdict == "same":
            continue
        out.append(f"\n## {name}: {verdict}" + (f" (ignored as volatile: {', '.join(ignored)})" if ignored else "") + "\n")
        if ": old " in name:
            continue  # a count of unpaired paths: the heading says it all
        if name in ("rc", "stdout", "stderr"):
            a, b = o1[name], new[name]
        else:
            a = o1["contents"].get(name, f"{o1['files'].get(name, ['absent'])}".encode())
            b = new["contents"].get(name, f"{new['files'].get(name, ['absent'])}".encode())
        out.extend(difflib.unified_diff(text_of(a), text_of(b), f"old/{name}", f"new/{name}"))
    return "".join(line if line.endswith("\n") else line + "\n" for line in out)


def same_bytes(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("rc", "stdout", "stderr", "files", "contents"))


def run_case(n: int, case: Case, old: Side, new: Side) -> dict:
    """Old twice, then new, each in a fresh ``BASE/case-N`` from the same fixture."""
    case_dir = BASE / f"case-{n}"
    argv = [a.replace("{C}", str(case_dir)) for a in case.argv]
    fixture = BASE / "fixtures" / case.fixture
    o1 = run_once(old, argv, case_dir, fixture)
    nb = run_once(new, argv, case_dir, fixture)
    # The second old run only tells what to ignore; where new matched old byte for byte there is
    # nothing to ignore, and no verdict depends on it (a third of the runs saved).
    o2 = o1 if same_bytes(o1, nb) else run_once(old, argv, case_dir, fixture)
    shutil.rmtree(case_dir, ignore_errors=True)
    parts = compare_runs(o1, o2, nb)
    verdicts = {v for v, _ in parts.values()}
    verdict = "differs" if "differs" in verdicts else "unstable" if "unstable" in verdicts else "same"
    return {"n": n, "family": case.family, "argv": argv, "fixture": case.fixture, "verdict": verdict,
            "rc": [o1["rc"], nb["rc"]], "parts": {k: v for k, v in parts.items()},
            "seconds": [round(o1["seconds"], 2), round(nb["seconds"], 2)], "old_twice": o2 is not o1,
            "diff": diff_text(case, argv, o1, nb, parts) if verdict != "same" else ""}


# --- discovery: what the sides say they have ----------------------------------------------------

def cli_output(side: Side, *argv: str) -> str:
    where = BASE / "discover"
    restore(BASE / "fixtures" / "empty", where)
    proc = subprocess.run([str(side.bin / "fi-autotune"), *argv], cwd=where, env=case_env(where, side),
                          capture_output=True, text=True, timeout=CMD_TIMEOUT)
    return proc.stdout


def commands_in(help_text: str) -> list[str]:
    """The names click lists under ``Commands:``."""
    names, inside = [], False
    for line in help_text.splitlines():
        if line.strip() == "Commands:":
            inside = True
        elif inside and re.match(r"^  \S", line):
            names.append(line.split()[0])
        elif inside and line and not line.startswith(" "):
            inside = False
    return names


def discover(sides: list[Side]) -> tuple[list[tuple[str, ...]], list[str]]:
    """Every command path (``()`` the group, ``("plan",)``, subcommands) and every built-in
    preset, as the union over both sides: a command only one side has is compared too."""
    paths: list[tuple[str, ...]] = [()]
    presets: list[str] = []
    for side in sides:
        for top in commands_in(cli_output(side, "--help")):
            for path in [(top,)] + [(top, sub) for sub in commands_in(cli_output(side, top, "--help"))]:
                if path not in paths:
                    paths.append(path)
        for preset in presets_in(cli_output(side, "plan", "--list-presets")):
            if preset not in presets:
                presets.append(preset)
    return paths, presets


def presets_in(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


# --- the commands ---------------------------------------------------------------------------------

GLM = "zai-org/GLM-5.1-FP8"
GLM_ID = "0.7.2.post1/sm100/d99390dfa961185d"   # devtools/synthetic.py's default entry
KEY_ARGS = ("--model", GLM, "--tp", "8", "--pp", "1", "--dp", "8", "--ep", "1", "--dtype", "bfloat16",
            "--quantization", "fp8", "--moe-runner-backend", "flashinfer_trtllm", "--config-class", "GlmMoeDsaConfig",
            "--arch", "sm100", "--flashinfer-version", "0.7.2.post1")
MOE_PRESETS = ("Qwen/Qwen3-30B-A3B", "deepseek-ai/DeepSeek-V3", "zai-org/GLM-5.1-FP8", "openai/gpt-oss-120b",
               "mistralai/Mixtral-8x7B-v0.1")
MOE_BACKENDS = ("flashinfer_cutlass", "flashinfer_trtllm", "flashinfer_mxfp4", "flashinfer_cutedsl", "triton", "auto")
SGLANG = ("--", "python", "-m", "sglang.launch_server")
TREE, VLLM, STORE = ("--cache-dir", "{C}/tree"), ("--cache-dir", "{C}/vllm", "--layout", "vllm"), "file://{C}/store"


def help_cases(paths: list[tuple[str, ...]]) -> list[Case]:
    cases = [Case("help", (*p, "--help"), "empty") for p in paths]
    return cases + [Case("help", ("plan", "-h"), "empty"), Case("help", ("ls", "-h"), "empty")] + [Case("help", a, "empty") for a in ((), ("--version",), ("no-such-command",), ("--bogus",))]


def plan_cases(presets: list[str]) -> list[Case]:
    """Every preset at a few topologies, text and --json, both arches and every layout."""
    out = []
    for model in presets:
        m = ("plan", "--model", model, "--cache-dir", "{C}/cache")
        out += [Case("plan", (*m, "--tp", "1", "--arch", "sm90"), "empty"),
                Case("plan", (*m, "--tp", "8", "--dp", "8", "--arch", "sm100", "--json"), "empty"),
                Case("plan", (*m, "--tp", "2", "--arch", "sm90", "--layout", "vllm", "--json"), "empty"),
                Case("plan", (*m, "--tp", "8", "--arch", "sm100", "--layout", "flashinfer-v2"), "empty")]
    for model in MOE_PRESETS:
        m = ("plan", "--model", model, "--cache-dir", "{C}/cache", "--arch", "sm100")
        out += [Case("plan", (*m, "--tp", "8", "--ep", "8", "--json"), "empty"),
                Case("plan", (*m, "--tp", "8", "--dp", "8", "--ep", "8"), "empty")]
        out += [Case("plan", (*m, "--tp", "4", "--moe-runner-backend", b, *j), "empty")
                for b, j in zip(MOE_BACKENDS, [(), ("--json",)] * 3)]
    return out


def serving_cases() -> list[Case]:
    """``plan``/``check`` -- the serving command, good and bad (usage errors exit 2)."""
    q = (*SGLANG, "--model-path", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass")
    g = (*SGLANG, "--model-path", GLM, "--tp", "8", "--dp", "8", "--enable-dp-attention", "--ep", "8")
    env = ("--", "SGLANG_CACHE_DIR={C}/sgl", "python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-30B-A3B")
    serves = [q, g, env, (*q, "--cuda-graph-max-bs", "256"), (*q, "--chunked-prefill-size", "4096"),
              (*q, "--speculative-algo", "EAGLE"), (*q, "--context-length", "32Ki"),
              ("--", "sglang", "serve", "--model", "Qwen/Qwen3-30B-A3B", "--tensor-parallel-size=4"),
              (*q, "--no-such-flag"), (*q, "--kv-cache-dtype", "fp9"), (*q, "--tp"), ("--", "python", "-m", "sglang.launch_server"),
              ("--", "python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"), ("--",)]
    out = []
    for s in serves:
        out += [Case("plan --", ("plan", "--arch", "sm90", "--cache-dir", "{C}/cache", *s), "empty"),
                Case("plan --", ("plan", "--arch", "sm90", "--json", "--cache-dir", "{C}/cache", *s), "empty")]
    out += [Case("check --", ("check", "--arch", "sm90", "--cache-dir", "{C}/warm", *s), "warm") for s in serves[:5]]
    out += [Case("check --", ("check", "--strict", "--arch", "sm90", "--json", "--cache-dir", "{C}/warm", *s), "warm")
            for s in serves[:3]]
    return out


def bad_input_cases() -> list[Case]:
    p = ("plan", "--cache-dir", "{C}/cache", "--arch", "sm90")
    bad = [(*p, "--model", "no-such/model"), (*p, "--model", "Qwen/Qwen3-30B-A3B", "--tp", "0"),
           (*p, "--model", "Qwen/Qwen3-30B-A3B", "--tp", "-1"), (*p, "--model", "Qwen/Qwen3-30B-A3B", "--tp", "x"),
           (*p, "--model", "Qwen/Qwen3-30B-A3B", "--tp", "3"), (*p, "--model", "Qwen/Qwen3-30B-A3B", "--dp", "3"),
           (*p, "--model", "{C}/missing-dir"), (*p, "--model", "{C}/not-json.json"), (*p,),
           ("plan", "--model", "Qwen/Qwen3-30B-A3B", "--arch", "hopper"),
           ("plan", "--model", "Qwen/Qwen3-30B-A3B", "--layout", "nope"),
           ("plan", "--model", "Qwen/Qwen3-30B-A3B", "--moe-runner-backend", "nope"),
           ("key", *KEY_ARGS, "--schema", "nope"), ("key", *KEY_ARGS, "--dp", "3"), ("key", *KEY_ARGS, "--dtype", "int7"),
           ("key", *KEY_ARGS, "--tp", "-1"), ("key", *KEY_ARGS, "--arch", "hopper"), ("key",), ("key", "id"),
           ("show", "0.7.2.post1/sm100/0000000000000000", *TREE), ("show", "not-an-id", *TREE), ("show",),
           ("rm", "0.7.2.post1/sm100/0000000000000000", "-y", *TREE), ("rm",),
           ("import", "{C}/missing.tar.gz", *TREE), ("import", "{C}/not-json.json", *TREE),
           ("export", "-o", "/proc/self/x.tar.gz", *TREE), ("doctor", "{C}/missing.log"), ("doctor",),
           ("diff",), ("diff", GLM_ID, "0.7.2.post1/sm100/0000000000000000", *TREE),
           ("push", "file:///nonexistent-store", *TREE), ("push",), ("pull",), ("pull", "file://{C}/no-store", *TREE),
           ("ls", "--bogus"), ("ls", "--status", "weird", *TREE), ("ls", "--flashinfer-version", "../x", *TREE),
           ("ls", "--env-from", "{C}/bad-env.json", *TREE), ("ls", "--env-from", "{C}/missing.json", *TREE),
           ("prune", "--keep-latest", "-1", "-y", *TREE), ("prune", "--older-than", "soon", "-y", *TREE),
           ("prune", "--arch", "hopper", "-y", *TREE), ("prune", "--status", "stale", "-y", *TREE),
           ("convert",), ("check", "--model", "no-such/model", *TREE), ("warm",), ("verify",)]
    return [Case("bad input", a) for a in bad]


def tree_cases() -> list[Case]:
    """The tree commands over the synthetic tree, the vLLM tree and the warmed tree; reading
    commands in text, --json and -q; writing ones for real and with --dry-run."""
    reads = [("ls",), ("ls", "--sort", "size"), ("ls", "--sort", "age", "--reverse"), ("ls", "--limit", "2"),
             ("ls", "--dir"), ("ls", "--status", "complete"), ("ls", "--status", "corrupt"), ("ls", "--model", GLM),
             ("ls", "--arch", "sm90"), ("ls", "--flashinfer-version", "0.7.1"), ("ls", "--env-from", "{C}/h100.json"),
             ("ls", "--env-from", "{C}/h200.json"), ("ls", "--check-env"), ("ls", "--older-than", "30d"),
             ("ls", "--larger-than", "1K"), ("show", GLM_ID), ("show", GLM_ID, "--buckets"),
             ("show", GLM_ID, "--env-from", "{C}/h100.json"), ("show", "0.7.1/sm100"),
             ("diff", GLM_ID, GLM_ID), ("diff", GLM_ID, "0.7.2.post1/sm90", "--all"), ("diff", GLM_ID, "0.7.2.post1/sm90", "--exit-code"),
             ("prune", "--dry-run"), ("prune", "--status", "corrupt", "--dry-run"),
             ("prune", "--status", "stale", "--env-from", "{C}/h200.json", "--dry-run"), ("rm", GLM_ID, "--dry-run"),
             ("export", "-o", "{C}/out.tar.gz", "--dry-run"), ("push", STORE, "--dry-run"),
             ("pull", STORE, "--cache-dir", "{C}/fresh", "--any-env", "--dry-run")]
    writes = [("prune", "-y"), ("prune", "--status", "corrupt", "-y"), ("prune", "--keep-latest", "1", "-y"),
              ("prune", "--other-versions", "-y"), ("prune", "--status", "stale", "--env-from", "{C}/h200.json", "-y"),
              ("prune", "--max-size", "10K", "-y"), ("rm", GLM_ID, "-y"), ("rm", "0.7.1/sm100", "-y"),
              ("export", "-o", "{C}/out.tar.gz"), ("export", GLM_ID, "-o", "{C}/one.tar.gz"),
              ("export", "--include-incomplete", "-o", "{C}/all.tar.gz"), ("import", "{C}/tree.tar.gz"),
              ("import", "{C}/tree.tar.gz", "--cache-dir", "{C}/fresh"), ("import", "{C}/tree.tar.gz", "--force"),
              ("push", STORE), ("push", "file://{C}/new-store"), ("push", "file://{C}/new-store", GLM_ID),
              ("push", "file://{C}/new-store", "--include-incomplete"),
              ("pull", STORE, "--cache-dir", "{C}/fresh", "--any-env"), ("pull", STORE, "--cache-dir", "{C}/fresh"),
              ("pull", STORE, GLM_ID, "--cache-dir", "{C}/fresh", "--any-env"), ("pull", STORE, "--any-env", "--force"),
              ("convert", GLM_ID, "--layout", "vllm", "--to", "{C}/conv"), ("convert", "--layout", "flashinfer-v2", "--to", "{C}/conv"),
              ("convert", GLM_ID, "--layout", "sglang", "--to", "{C}/conv")]
    out = []
    for a in reads + writes:
        cache = () if any(x == "--cache-dir" for x in a) else TREE
        out.append(Case(a[0], (*a, *cache)))
        if a[0] in ("ls", "show", "diff", "prune", "rm", "export", "import", "push", "pull") and "-o" not in a[:2]:
            out.append(Case(a[0], (*a, *cache, "--json")))
        if a[0] in ("ls", "prune") and a == reads[0] or a[:2] == ("prune", "--dry-run"):
            out.append(Case(a[0], (*a, *cache, "-q")))
    out += [Case("ls", ("ls", STORE)), Case("ls", ("ls", STORE, "--json")), Case("ls", ("ls", *VLLM)),
            Case("ls", ("ls", *VLLM, "--json")), Case("show", ("show", "0123456789abcdef", *VLLM)),
            Case("ls", ("ls",)), Case("ls", ("ls", "--json")), Case("prune", ("prune", STORE, "--dry-run")),
            Case("prune", ("prune", STORE, "-y")), Case("rm", ("rm", "0123456789abcdef", "-y", *VLLM)),
            Case("export", ("export", "-o", "-", *TREE)), Case("ls", ("ls", "--layout", "flashinfer-v2", "--cache-dir", "{C}/conv"))]
    return out


def warm_tree_cases() -> list[Case]:
    """A tree the real orchestrator wrote (fake GPUs): key, check, ls, show, export."""
    q = ("--model", "Qwen/Qwen3-30B-A3B", "--moe-runner-backend", "flashinfer_cutlass", "--arch", "sm90",
         "--flashinfer-version", "0.7.2.post1")
    w = ("--cache-dir", "{C}/warm")
    out = [Case("key", ("key", *KEY_ARGS, *j), "empty") for j in ((), ("--json",), ("-q",))]
    out += [Case("key", ("key", "--model", "m", "--tp", "2", "--dp", "2", "--no-dp-attention", "--quantization", "None",
                         "--config-class", "LlamaConfig", "--arch", "SM90", "--flashinfer-version", "0.7.2.post1", *j), "empty")
            for j in ((), ("--json",))]
    for args in ((*q, "--tp", "2"), (*q, "--tp", "4"), (*q, "--tp", "2", "--layout", "vllm"), (*q, "--tp", "2", "--strict"),
                 ("--model", GLM, "--tp", "8", "--arch", "sm100"), (*q, "--tp", "2", "--store", "file://{C}/nostore")):
        out += [Case("check", ("check", *args, *w, *j), "warm") for j in ((), ("--json",))]
    out += [Case("check", ("check", *q, "--tp", "2", "--env-from", "{C}/h200.json", *TREE), "tree")]
    for a in (("ls",), ("ls", "--json"), ("ls", "-q"), ("prune", "--dry-run"), ("export", "-o", "{C}/w.tar.gz")):
        out.append(Case(a[0], (*a, *w), "warm"))
    return out


def doctor_cases(logs: list[str]) -> list[Case]:
    out = []
    for log in logs:
        out += [Case("doctor", ("doctor", f"{{C}}/logs/{log}", *j, "--cache-dir", "{C}/tree")) for j in ((), ("--json",))]
    out += [Case("doctor", ("doctor", *(f"{{C}}/logs/{x}" for x in logs[:4]))),
            Case("env", ("env", "--allow-unknown"), "empty"), Case("env", ("env", "--allow-unknown", "--json"), "empty"),
            Case("env", ("env",), "empty")]
    return out


# --- the run --------------------------------------------------------------------------------------

FIXTURES = ("empty", "tree", "warm")


def all_cases(old: Side, new: Side) -> list[Case]:
    paths, presets = discover([old, new])
    logs = sorted(p.name for p in (old.root / ENGINE_LOGS).glob("*.log"))
    return [*help_cases(paths), *plan_cases(presets), *serving_cases(), *warm_tree_cases(), *tree_cases(),
            *doctor_cases(logs), *bad_input_cases()]


def table(results: list[dict]) -> tuple[str, dict]:
    """Counts per command family: run, identical, differing, unstable (the old side disagreed
    with itself beyond what could be ignored)."""
    fams: dict[str, dict[str, int]] = {}
    for r in results:
        row = fams.setdefault(r["family"], {"run": 0, "same": 0, "differs": 0, "unstable": 0})
        row["run"] += 1
        row[r["verdict"]] += 1
    total = {k: sum(row[k] for row in fams.values()) for k in ("run", "same", "differs", "unstable")}
    lines = [f"{'family':<12} {'run':>5} {'identical':>10} {'differing':>10} {'unstable':>9}"]
    for name, row in sorted(fams.items()) + [("TOTAL", total)]:
        lines.append(f"{name:<12} {row['run']:>5} {row['same']:>10} {row['differs']:>10} {row['unstable']:>9}")
    return "\n".join(lines), {"families": fams, "total": total}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="a checkout dir with .venv, or a git ref of this repository")
    ap.add_argument("--new", required=True, help="a checkout dir with .venv (or a git ref)")
    ap.add_argument("--out", required=True, type=Path, help="RESULT_DIR: cli_compare.json and diffs/")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="cases run in parallel")
    ap.add_argument("--family", action="append", help="only these command families (repeatable)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    old, new = prepare_side(args.old, "old"), prepare_side(args.new, "new")
    for kind in FIXTURES:
        build_fixtures(old, kind, BASE / "fixtures" / kind)
    cases = [c for c in all_cases(old, new) if not args.family or c.family in args.family]
    print(f"old {old.root} (FlashInfer {flashinfer_of(old)})\nnew {new.root} (FlashInfer {flashinfer_of(new)})\n"
          f"{len(cases)} commands, {args.jobs} at a time", file=sys.stderr)
    results = []
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        for r in pool.map(run_case, range(len(cases)), cases, [old] * len(cases), [new] * len(cases)):
            results.append(r)
            if r["verdict"] != "same" or len(results) % 25 == 0:
                print(f"[{len(results)}/{len(cases)} {time.monotonic() - t0:.0f}s] {r['verdict']}: "
                      f"fi-autotune {' '.join(r['argv'])}", file=sys.stderr, flush=True)
    text, counts = table(results)
    print(text)
    shutil.rmtree(args.out / "diffs", ignore_errors=True)
    (args.out / "diffs").mkdir(parents=True)
    for r in results:
        if r["verdict"] != "same":
            (args.out / "diffs" / f"case-{r['n']:03d}-{r['verdict']}.diff").write_text(r["diff"])
    doc = {"old": str(old.root), "new": str(new.root), "old_commit": head_of(old), "new_commit": head_of(new),
           "seconds": round(time.monotonic() - t0, 1), **counts,
           "cases": [{k: v for k, v in r.items() if k != "diff"} for r in results]}
    (args.out / "cli_compare.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"{doc['seconds']} s; {args.out}/cli_compare.json, {sum(r['verdict'] != 'same' for r in results)} diffs in "
          f"{args.out}/diffs/")
    return 1 if counts["total"]["differs"] or counts["total"]["unstable"] else 0


def flashinfer_of(side: Side) -> str:
    """The FlashInfer the side's venv holds (a plan names it: two sides that differ here differ in
    every plan's output)."""
    code = "import importlib.metadata as m; print(m.version('flashinfer-python'))"
    try:
        return sh([side.bin / "python", "-c", code]).stdout.strip()
    except subprocess.CalledProcessError:
        return "not installed"


def head_of(side: Side) -> str:
    """The side's commit, ``+dirty`` when its work tree has changes."""
    try:
        sha = sh(["git", "-C", side.root, "rev-parse", "HEAD"]).stdout.strip()
        dirty = sh(["git", "-C", side.root, "status", "--porcelain", "--untracked-files=no"]).stdout.strip()
    except subprocess.CalledProcessError:
        return "?"
    return sha + ("+dirty" if dirty else "")


if __name__ == "__main__":
    sys.exit(main())
