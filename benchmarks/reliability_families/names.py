"""Look-alike names in every layout's tree."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from .common import Row, SG, cli
from .exact import _tree_entries
from .http import _snapshot

from devtools.synthetic import write_vllm_entry


def _look_alikes(eid: str) -> list[tuple[str, str]]:
    """(what, name) look-alikes of a real id: whitespace, case, non-ASCII digits."""
    out = [("trailing newline", eid + "\n"), ("trailing space", eid + " "), ("leading space", " " + eid),
           ("trailing tab", eid + "\t"), ("trailing CR", eid + "\r")]
    last = eid.rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    if last.upper() != last:
        out.append(("upper case", eid[: len(eid) - len(last)] + last.upper()))
    i = next((i for i, c in enumerate(eid) if c.isdigit()), None)
    if i is not None:
        out.append(("arabic-indic digit", eid[:i] + chr(0x0660 + int(eid[i])) + eid[i + 1:]))
        out.append(("fullwidth digit", eid[:i] + chr(0xFF10 + int(eid[i])) + eid[i + 1:]))
        out.append(("mathematical digit", eid[:i] + chr(0x1D7CE + int(eid[i])) + eid[i + 1:]))
    return out

def _layout_tree(work: Path, layout: str) -> tuple[Path, list[str], Path, dict]:
    """A tree of ``layout`` with its real entries, their ids, the real entry's dir, the env."""
    env = {"XDG_CACHE_HOME": str(work / "xdg"), "FLASHINFER_AUTOTUNE_CACHE_DIR": str(work / "no-v2")}
    if layout == "sglang":
        root = work / "sg"
        ids = _tree_entries("look", root, 2)
        path = SG.entry_dir(root, SG.parse_id(ids[0]))
    elif layout == "vllm":
        root = work / "vl"
        path = write_vllm_entry(root, "ab" * 32)
        write_vllm_entry(root, "cd" * 32, seed=1)
    else:
        src, root = work / "v2src", work / "v2"
        eid = _tree_entries("lookv2", src, 1)[0]
        assert cli("convert", eid, "--layout", "flashinfer-v2", "--to", root, "--cache-dir", src, env=env).returncode == 0
        path = next((root / "v2").iterdir())
        env["FLASHINFER_AUTOTUNE_CACHE_DIR"] = str(root)
    p = cli("ls", "-q", "--layout", layout, "--cache-dir", root, env=env)
    ids = p.stdout.decode().split()
    return root, ids, path, env

def look_alike_names(tmp: Path) -> Row:
    """In every layout (sglang, vllm, flashinfer-v2): next to the real entry, copies of it under
    look-alike dir names (a trailing newline or space, upper case, a non-ASCII digit); then each
    look-alike of the real id given to ``rm -y``, ``show``, ``export`` and ``pull URL`` (from a
    file:// store the layout was pushed to). A look-alike must never name the real entry: ``rm``
    deleting anything is a wrong delete; ``show``/``export``/``pull`` succeeding is a wrong
    install (it acted on an entry that was not named); ``ls`` listing a look-alike dir, or
    ``prune --status corrupt -y`` removing one (they are not ours), likewise."""
    row = Row()
    for layout in ("sglang", "vllm", "flashinfer-v2"):
        work = tmp / f"look-{layout}"
        root, ids, path, env = _layout_tree(work, layout)
        store = work / "store"
        p = cli("push", f"file://{store}", "--layout", layout, "--cache-dir", root,
                *(["--include-incomplete"] if layout == "vllm" else []), env=env)  # vLLM's files carry no manifest
        pushed = p is not None and p.returncode == 0
        if not pushed:
            row.details.append(f"note: {layout}: push refused ({p and p.stderr.decode(errors='replace').strip()[-150:]}); "
                               "pull of look-alikes not tried")
        twins = []
        for what, spoiled_dir in (("newline", path.name + "\n"), ("space", path.name + " "), ("upper", path.name.upper()),
                                  ("digit", re.sub(r"\d", lambda m: chr(0x0660 + int(m.group())), path.name, count=1))):
            twin = path.with_name(spoiled_dir)
            if twin != path and not twin.exists():
                shutil.copytree(path, twin)
                twins.append(twin)
        on_disk = _snapshot(root)
        lay = ["--layout", layout, "--cache-dir", root]
        row["attempts"] += 1
        listed = row.proc(cli("ls", "-q", *lay, env=env))
        if listed is not None and sorted(listed.stdout.decode().split("\n")[:-1]) != sorted(ids):
            row.fail("wrong installs", f"{layout}: ls -q lists {listed.stdout!r}, not the real ids {ids}")
        row["attempts"] += 1
        row.proc(cli("prune", "--status", "corrupt", "-y", *lay, env=env))
        gone = [t.name for t in twins if not t.is_dir()] + ([path.name] if not path.is_dir() else [])
        row.fail("wrong deletes", f"{layout}: prune --status corrupt removed {gone}", len(gone))
        for what, name in _look_alikes(ids[0]):
            for cmd in (["rm", "-y", name, *lay], ["show", name, *lay], ["export", "-o", work / "out.tgz", name, *lay],
                        *([["pull", f"file://{store}", name, "--any-env", "--layout", layout, "--cache-dir", work / "dest"]]
                          if pushed else [])):
                row["attempts"] += 1
                p = row.proc(cli(*cmd, env=env))
                where = f"{layout} {what} {cmd[0]}"
                if p is None:
                    continue
                now = _snapshot(root) if root.exists() else {}
                lost = sorted({k.split("/")[-2] for k in on_disk if k not in now})
                if lost:
                    row.fail("wrong deletes", f"{where}: {lost} deleted")
                    break
                if p.returncode == 0:
                    row.fail("wrong installs", f"{where} {name!r}: exit 0 (acted on {ids[0]})")
                if cmd[0] == "export" and (work / "out.tgz").exists():
                    (work / "out.tgz").unlink()
                if (work / "dest").exists():
                    shutil.rmtree(work / "dest")
        shutil.rmtree(work, ignore_errors=True)
    return row
