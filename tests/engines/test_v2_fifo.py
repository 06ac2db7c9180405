"""``convert`` into FlashInfer's managed store never blocks on a FIFO left at an entry's name
(it held the entry lock for as long as it waited: 120 s and more in the adversarial run)."""

from __future__ import annotations

import os
import stat

from autotune_cache.plan.flags import ServerFlags
from autotune_cache.plan.request import TuneRequest
from devtools.synthetic import write_plan_entry

from ..conftest import run_cli, run_json


def test_convert_replaces_a_fifo_in_entries_instead_of_hanging(root, tmp_path):
    plan = TuneRequest("nvidia/Llama-3.1-70B-Instruct-FP8", ServerFlags(tp=4), arch="sm90",
                       flashinfer_version="0.7.2.post1").plan(root)
    eid = write_plan_entry(plan)
    v2root = tmp_path / "v2"
    args = ("convert", str(eid), "--layout", "flashinfer-v2", "--to", str(v2root), "--cache-dir", str(root))
    (first,) = run_json(*args)["entries"]
    entries = sorted((v2root / "v2" / first["env_hash"] / "entries").iterdir())
    victim = entries[0]
    victim.unlink()
    os.mkfifo(victim)
    proc = run_cli(*args, "--json", timeout=30)  # before: blocked in open() until killed
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISREG(os.lstat(victim).st_mode)
    again = run_json(*args)
    assert again["entries"][0]["written"] == 0 and again["entries"][0]["unchanged"] == first["written"]
    assert "Traceback" not in proc.stderr
