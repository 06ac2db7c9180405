"""Record which FlashInfer each engine release requires, from the release's own wheel.

A stock install of an engine brings the FlashInfer its wheel pins, and that FlashInfer's version is
a directory of the cache path the engine reads (``.../flashinfer/autotune/<version>/...``). A cache
made with another FlashInfer is not found there, so the plan says so (``Engine.flashinfer_pins``).
This downloads each wheel (``pip download --no-deps``), reads ``Requires-Dist`` from its METADATA
and writes ``tests/data/engine_flashinfer_pins.json``; ``tests/engines/test_engine_pins.py``
compares the engines' tables with it. Runs in any Python with pip and a package index; never in CI.

    python tests/oracle/engine_pins.py            # re-record
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

RELEASES = {"sglang": ("0.5.23",), "vllm": ("0.33.0",)}
GOLDEN = Path(__file__).resolve().parents[1] / "data" / "engine_flashinfer_pins.json"
#: ``flashinfer_python[cu13]==0.7.2 ; extra == "..."``: the distribution, extras, an exact pin.
_REQ = re.compile(r"^flashinfer[-_]python(\[[^\]]*\])?\s*==\s*([^\s;,]+)", re.IGNORECASE)


def requirement(wheel: Path) -> tuple[str, str]:
    """(the Requires-Dist line, the pinned version) of flashinfer-python in ``wheel``'s METADATA."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(name).decode().splitlines()
    for line in lines:
        if line.startswith("Requires-Dist:"):
            req = line.split(":", 1)[1].strip()
            m = _REQ.match(req)
            if m:
                return req, m.group(2)
    raise SystemExit(f"{wheel.name}: no exact flashinfer-python pin in its METADATA")


def main() -> int:
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for engine, releases in RELEASES.items():
            for release in releases:
                dest = Path(tmp) / f"{engine}-{release}"
                subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                                "-d", str(dest), f"{engine}=={release}"], check=True)
                wheel = next(dest.glob("*.whl"))
                req, pin = requirement(wheel)
                out.setdefault(engine, {})[release] = {"wheel": wheel.name, "requires_dist": req, "flashinfer": pin}
    GOLDEN.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
