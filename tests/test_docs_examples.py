"""The fenced bash examples of README.md and docs/*.md, run as written where they can run here.

Each example (a logical line of a ```bash block: ``\\`` continuations joined, a heredoc or a
``for ... done`` loop as one) is either in ``RUN`` (run with bash in a sandbox: a tmp dir holding
a synthetic tree at ``./sglang-cache`` and at ``$SGLANG_CACHE_DIR``, ``HOME`` pointed there, the
files the examples name - ``env.json``, ``targets.yaml``, ``caches.tgz``) with the exit status it
must give, or in ``NOT_RUN`` with the reason. A new example is neither until it is named:
``test_every_example_is_run_or_named`` fails on it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.synthetic import DEFAULT_METADATA, write_fake_entry, write_plan_entry

from .conftest import REPO, run_cli
from .support.zygotes import cli_on_path

GPU = "needs a GPU (tunes, replays or times kernels)"
S3 = "needs an S3 bucket and credentials (a store on the network)"
STORE = "needs $STORE, a store set up by the earlier steps of its CI job"
INSTALL = "installs packages (network)"
SUITE = "runs the test suite itself"
CLUSTER = "needs a cluster (kubectl, srun, a Kubernetes Indexed Job)"
BENCH = "a GPU benchmark"
ORACLE = "needs the SGLang oracle environment (tests/oracle/README.md)"
PATHS = "names files of the reader's own machine (/pinned, /other/entry/dir)"


def examples() -> list[tuple[str, str]]:
    """(file, example) for every example of README.md and docs/*.md, comments and spacing removed."""
    out = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", path.read_text(), re.S):
            lines = block.replace("\\\n", " ").splitlines()
            i = 0
            while i < len(lines):
                line, i = lines[i], i + 1
                if not line.strip() or line.strip().startswith("#"):
                    continue
                if (m := re.search(r"<<\s*'?(\w+)'?", line)) is not None:  # a heredoc, to its end
                    while i < len(lines) and lines[i].strip() != m.group(1):
                        line, i = line + "\n" + lines[i], i + 1
                    line, i = line + "\n" + m.group(1), i + 1
                elif re.match(r"\s*(for|while)\b", line):
                    while i < len(lines) and lines[i - 1].strip() != "done":
                        line, i = line + "\n" + lines[i], i + 1
                out.append((path.relative_to(REPO).as_posix(), _normal(line)))
    return out


def _normal(example: str) -> str:
    """Without its trailing comment and with single spaces (a heredoc's body kept as it is)."""
    first, _, rest = example.partition("\n")
    first = re.sub(r"\s+#\s[^'\"]*$", "", first)
    return " ".join(first.split()) + ("\n" + rest if rest else "")


QWEN_ID = "0.7.2.post1/sm90/c2dc70e43f92ac81"  # Qwen/Qwen3-30B-A3B --tp 2 --moe-runner-backend flashinfer_cutlass

#: example -> the exit status it gives in the sandbox
RUN = {
    "fi-autotune export -o caches.tgz --cache-dir ./sglang-cache": 0,
    'shipped=$(mktemp -d) && tar xzf caches.tgz -C "$shipped"': 0,
    f"fi-autotune show {QWEN_ID} --buckets": 0,
    "fi-autotune plan --targets targets.yaml --arch sm90": 0,
    "fi-autotune workers status --json": 1,  # none runs: exit 1, as the comment says
    "fi-autotune workers stop": 0,
    "echo $?": 0,
    "mkdir -p artifact && cp env.json artifact/": 0,
    "cp artifact/env.json env.json": 0,
}

#: What the store examples exit with here: a pull finds its entry (the sandbox's tree was pushed);
#: the fleet gate fails (exit 1, as docs/fleet.md says it does on a miss) because the store holds the
#: Qwen entries only and fleet.md's targets.yaml names more targets than that.
PULL_CODE = 0
PULL_EMPTY_CODE = 0
CHECK_CODE = 1
#: example -> the exit status it gives in the sandbox, with ``s3://bucket/caches`` and ``$STORE`` a
#: bucket of a real S3 server on loopback (moto) that holds the sandbox's tree, pushed before it
RUN_S3 = {
    "fi-autotune pull s3://bucket/caches --cache-dir ./sglang-cache --env-from env.json --model Qwen/Qwen3-30B-A3B "
    "--model-path /models/Qwen3-30B-A3B --tp 2 --moe-runner-backend flashinfer_cutlass": PULL_CODE,
    'fi-autotune pull "$STORE" --cache-dir ./sglang-cache --env-from env.json --model Qwen/Qwen3-30B-A3B '
    "--model-path /models/Qwen3-30B-A3B --tp 2 --moe-runner-backend flashinfer_cutlass": PULL_CODE,
    'fi-autotune pull "$STORE" --cache-dir ./emptydir --env-from env.json --model Qwen/Qwen3-30B-A3B --tp 2 '
    "--moe-runner-backend flashinfer_cutlass": PULL_EMPTY_CODE,
    'fi-autotune push "$STORE"': 0,
    'fi-autotune ls -q "$STORE"': 0,
    "fi-autotune check --targets targets.yaml --store s3://bucket/caches --env-from env.json --strict": CHECK_CODE,
    'fi-autotune check --targets targets.yaml --store "$STORE" --env-from env.json --strict': CHECK_CODE,
    "fi-autotune diff ./sglang-cache s3://bucket/caches --exit-code": 0,
    f"fi-autotune diff {QWEN_ID} s3://bucket/caches": 0,
}

#: example -> why it is not run here
NOT_RUN = {
    'python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e ".[test]" && '
    "fi-autotune plan --model zai-org/GLM-5.1-FP8 --tp 8 --dp 8 --arch sm100": INSTALL,
    "python -m pytest -q": SUITE,
    "fi-autotune warm --model nvidia/Llama-3.1-70B-Instruct-FP8 --tp 4": GPU,
    "fi-autotune verify --model nvidia/Llama-3.1-70B-Instruct-FP8": GPU,
    "fi-autotune env --json > env.json": "imports flashinfer and reads this host's GPU (exit 1 without one)",
    "fi-autotune warm --model Qwen/Qwen3-30B-A3B --model-path /models/Qwen3-30B-A3B --tp 2 --moe-runner-backend "
    "flashinfer_cutlass && fi-autotune push s3://bucket/caches": GPU,
    'fi-autotune check --strict --cache-dir "$shipped" --env-from env.json --model Qwen/Qwen3-30B-A3B -- python -m '
    "sglang.launch_server --model-path /models/Qwen3-30B-A3B --tp-size 2 --moe-runner-backend flashinfer_cutlass":
        "needs $shipped from the step before it in the same shell, and the served model's config at /models",
    "kubectl logs sglang-0 --prefix > boot.log": CLUSTER,
    "fi-autotune doctor boot.log --cache-dir /image/root/.cache/sglang": "reads the server log the kubectl step wrote",
    "fi-autotune warm --model Qwen/Qwen3-30B-A3B --model-path /models/Qwen3-30B-A3B --tp 2 --moe-runner-backend "
    "flashinfer_cutlass": GPU,
    "fi-autotune warm --targets targets.yaml --push s3://bucket/caches": GPU,
    "fi-autotune workers start --gpus 2 --idle-timeout 1800": GPU,
    "fi-autotune warm --targets targets.yaml": GPU,
    "fi-autotune warm --model Qwen/Qwen3-30B-A3B --tp 2 --moe-runner-backend flashinfer_cutlass": GPU,
    "fi-autotune warm --model Qwen/Qwen3-30B-A3B --tp 2 --moe-runner-backend flashinfer_cutlass --quality careful": GPU,
    f"fi-autotune diff {QWEN_ID} /pinned/rank_tp0_pp0_dp0.json": PATHS,
    f"fi-autotune diff {QWEN_ID} /other/entry/dir --measure": GPU,
    "export FI_AUTOTUNE_SGLANG_PYTHON=/opt/sglang-oracle/bin/python": ORACLE,
    "python tests/oracle/record.py matrix && python tests/oracle/record.py flags": ORACLE,
    ".venv/bin/python tests/oracle/matrix_doc.py": ORACLE,
    "python -m pytest -q tests/engines/test_sglang_oracle.py tests/engines/test_sglang_flags.py": ORACLE,
}
#: examples not run, by their beginning (the CI steps of docs/deploy.md and the benchmarks)
NOT_RUN_PREFIXES = {
    "cat > targets.yaml <<": "a CI job's own targets file (its warm steps need GPUs and $STORE)",
    "for i in 0 1; do": CLUSTER,
    "for task in 1 2; do": CLUSTER,
    "srun ": CLUSTER,
    'fi-autotune check --strict --cache-dir "$shipped"': "needs $shipped from the step before it, and /models",
    "fi-autotune check --strict --cache-dir ./emptydir": "checks what the pull from $STORE before it fetched",
    "python benchmarks/": BENCH,
}


def _why_not(example: str) -> str | None:
    return NOT_RUN.get(example) or next((w for p, w in NOT_RUN_PREFIXES.items() if example.startswith(p)), None)


def test_every_example_is_run_or_named():
    unnamed = [(f, e) for f, e in examples() if e not in RUN and e not in RUN_S3 and _why_not(e) is None]
    assert not unnamed, "examples neither run nor named in NOT_RUN (add each to one):\n" + \
        "\n".join(f"{f}: {e}" for f, e in unnamed)
    seen = {e for _, e in examples()}
    assert not set(RUN) - seen and not set(RUN_S3) - seen and not set(NOT_RUN) - seen, \
        "examples no document has any more"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A tmp dir as a reader's shell would have it: a tree at ./sglang-cache (Qwen's entry, planned
    for real, and a GLM one), $SGLANG_CACHE_DIR and HOME there, env.json and fleet.md's targets.yaml."""
    from autotune_cache.plan.request import TuneRequest

    home = tmp_path_factory.mktemp("docs-examples")
    tree = home / "sglang-cache"
    tree.mkdir()
    write_fake_entry(tree)
    plan = run_cli("plan", "--model", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--moe-runner-backend", "flashinfer_cutlass",
                   "--arch", "sm90", "--flashinfer-version", "0.7.2.post1", "--cache-dir", str(tree), "--json")
    request = json.loads(plan.stdout)["workers"][0]["request"]
    assert write_plan_entry(TuneRequest.from_dict(request).plan(tree)).__str__() == QWEN_ID
    # and the one the README's warm writes for a server started from a local copy (--model-path /models/...)
    plan = run_cli("plan", "--model", "Qwen/Qwen3-30B-A3B", "--model-path", "/models/Qwen3-30B-A3B", "--tp", "2",
                   "--moe-runner-backend", "flashinfer_cutlass", "--arch", "sm90", "--flashinfer-version", "0.7.2.post1",
                   "--cache-dir", str(tree), "--json")
    write_plan_entry(TuneRequest.from_dict(json.loads(plan.stdout)["workers"][0]["request"]).plan(tree))
    (home / "env.json").write_text(json.dumps({"fingerprint": DEFAULT_METADATA, "arch": "sm90"}))
    (home / "artifact").mkdir()
    shutil.copy(home / "env.json", home / "artifact" / "env.json")  # what the CI's upload step carried
    fleet = (REPO / "docs" / "fleet.md").read_text()
    (home / "targets.yaml").write_text(re.search(r"```yaml\n# targets.yaml\n(.*?)```", fleet, re.S).group(1))
    bin_dir = Path(sys.executable).parent
    env = {**{k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")},
           "HOME": str(home), "SGLANG_CACHE_DIR": str(tree), "XDG_CACHE_HOME": str(home / "xdg"),
           "FLASHINFER_AUTOTUNE_CACHE_DIR": str(home / "flashinfer-store"), "FI_AUTOTUNE_WORKERS_DIR": str(home / "w"),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    if shutil.which("fi-autotune", path=env["PATH"]) is None:
        pytest.skip("no fi-autotune command on PATH (pip install -e .)")
    return home, env


@pytest.mark.parametrize("example", list(RUN))
def test_example_runs_as_written(sandbox, example):
    """The example with bash; its ``fi-autotune`` is the installed console script, each run a process
    forked by the test process's CLI fork server (``cli_on_path``) instead of a fresh interpreter."""
    home, env = sandbox
    with cli_on_path(env) as env:
        if example.startswith("shipped="):  # its archive from the step before
            subprocess.run(["fi-autotune", "export", "-o", "caches.tgz", "--cache-dir", "./sglang-cache"], cwd=home,
                           env=env, capture_output=True, check=True)
        proc = subprocess.run(["bash", "-c", example], cwd=home, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == RUN[example], f"{example}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"


@pytest.mark.parametrize("example", list(RUN_S3))
def test_store_example_runs_as_written(sandbox, s3, example):
    """The store examples against a real S3 server: the bucket holds the sandbox's tree (pushed
    first), ``s3://bucket/caches`` and ``$STORE`` name it."""
    home, env = sandbox
    with cli_on_path({**env, **s3["env"], "STORE": s3["url"]}) as env:  # as test_example_runs_as_written
        subprocess.run(["fi-autotune", "push", s3["url"], "--cache-dir", "./sglang-cache"], cwd=home, env=env,
                       capture_output=True, check=True, timeout=120)
        proc = subprocess.run(["bash", "-c", example.replace("s3://bucket/caches", s3["url"])], cwd=home, env=env,
                              capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == RUN_S3[example], f"{example}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    if example.startswith("fi-autotune check"):  # fleet.md's two Qwen targets found, the three others missed
        assert "2 of 5 targets covered" in proc.stdout and proc.stdout.count("MISS:") == 3, proc.stdout[-2000:]
