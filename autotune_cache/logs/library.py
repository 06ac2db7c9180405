"""FlashInfer's own lines, read the same under every engine: the autotuner's messages, its
handler's prefix and the tqdm bars of its tuning. FlashInfer is the library every engine tunes
through, not an engine: its lines reach an engine's handlers too (root propagation), so an
engine's line is matched against its own formats, then these.

Each entry names the file:line in FlashInfer's wheel where the format string is (the full list,
with the lines we do not need, is ``tests/data/engine_logs/FORMATS.md``; ``tests/logs/
test_formats.py`` holds the two in step). A line that matches none is not interpreted."""

from __future__ import annotations

import re

from autotune_cache.logs.dialect import TO_EOL, LineFormat, LogDialect, line_format, upto

#: FlashInfer's own handler: ``%(asctime)s - %(levelname)s - %(filename)s:%(lineno)d - flashinfer.jit:
#: %(message)s`` (flashinfer/jit/core.py:68). It carries no rank.
FLASHINFER_PREFIX = re.compile(
    r"(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d{3} - (?P<level>[A-Z]+) - (?P<file>[\w.]+):(?P<lineno>\d+)"
    r" - flashinfer\.jit: ")
#: A tqdm bar of ``AutoTuner.choose_one``: ``tqdm.tqdm(total=len(profiles), initial=_step,
#: desc=f"[AutoTuner]: Tuning {custom_op}", unit="profile")`` (flashinfer/autotuner/autotuner.py:2400-2406),
#: rendered by tqdm's ``format_meter``: ``{desc}: {pct:3.0f}%|{bar}| {n}/{total} [{elapsed}<{remaining},
#: {rate}]``. Printed by tqdm to stderr, not through logging: no prefix, no rank.
TQDM_BAR = re.compile(
    r"\[AutoTuner\]: Tuning (?P<op>\S+): +(?P<pct>\d+)%\|[^|]*\| (?P<n>\d+)/(?P<total>\d+) "
    r"\[(?P<elapsed>(?:\d+:)?\d+:\d\d)<(?P<remaining>[^,\]]*),(?P<rate>[^\]]*)\]")  # rate: the reader strips it
#: Where a tqdm bar starts (``TQDM_BAR`` whole), and its op as far as it goes.
BAR_START = re.compile(r"\[AutoTuner\]: Tuning (?P<op>[^\s|\[\]]*)")

_AT = "flashinfer/autotuner/autotuner.py"
_AC = "flashinfer/autotune_cache.py"

_MESSAGES: tuple[LineFormat, ...] = (
    line_format("flashinfer.start", "tuner.start", f"{_AT}:1048", r"^\[Autotuner\]: Autotuning process starts"),
    line_format("flashinfer.end", "tuner.end", f"{_AT}:1071", r"^\[Autotuner\]: Autotuning process ends"),
    line_format("flashinfer.hit", "tuner.hit", f"{_AT}:2020,2065",
                r"^\[Autotuner\]: Config cache hit for (?P<op>\S+) \(runner=(?P<runner>[^,]+), "
                r"source=(?P<source>config file|managed cache)\)"),
    line_format("flashinfer.loaded", "tuner.loaded", f"{_AT}:3815",
                rf"^\[Autotuner\]: Loaded (?P<n>\d+) configs from {TO_EOL}"),
    line_format("flashinfer.other_env", "tuner.other_env", f"{_AT}:3769",
                r"^\[Autotuner\]: Cache file " + upto("path", " was created in a different environment \\(", "+")
                + upto("diff", "\\)\\. Ignoring cached configs\\.")),
    line_format("flashinfer.not_saving", "tuner.not_saving", f"{_AT}:3585",
                r"^\[Autotuner\]: Not saving configs to "
                + upto("path", ": the file was created in a different environment", "+")),
    line_format("flashinfer.saved", "tuner.saved", f"{_AT}:3673",
                r"^\[Autotuner\]: Saved (?P<n>\d+) configs to (?P<path>.+) \((?P<new>\d+) new, (?P<prev>\d+) from previous"),
    line_format("flashinfer.uncovered", "tuner.uncovered", f"{_AT}:2294",
                r"^\[AutoTuner\]: No tuned config covers (?P<op>\S+) input_shapes=" + upto("shapes", "; falling back")),
    line_format("flashinfer.attached", "tuner.attached", f"{_AC}:496,449",
                r"^\[Autotuner\]: Managed autotune cache attached for this process: "
                r"ManagedAutotuneCache\(env_dir='(?P<env_dir>[^']+)'"),
    line_format("flashinfer.preloaded", "tuner.preloaded", f"{_AC}:529",
                r"^\[Autotuner\]: Preloaded (?P<n>\d+)/(?P<total>\d+) managed cache entries into memory"),
)


class FlashInferLines(LogDialect):
    """A log of FlashInfer with no engine line (a script of the user's, our ``verify``) is read
    in this dialect alone: its own lines then open and close the passes."""

    name = "flashinfer"
    label = "FlashInfer"
    release = "0.7.2.post1"
    prefix = FLASHINFER_PREFIX
    prefix_source = "flashinfer/jit/core.py:68"
    formats = _MESSAGES


LIBRARY = FlashInferLines()


def seconds(interval: str) -> int:
    """tqdm's ``format_interval`` back to seconds: ``00:27`` -> 27, ``1:01:40`` -> 3700."""
    total = 0
    for part in interval.split(":"):
        total = total * 60 + int(part)
    return total
