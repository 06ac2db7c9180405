"""The parser's format table and tests/data/engine_logs/FORMATS.md name the same source lines,
and every fixture line the parser reads matches a format of the table."""

from __future__ import annotations

from pathlib import Path

from autotune_cache.logs.formats import MESSAGES, PREFIXES
from autotune_cache.logs.reader import read_log

DATA = Path(__file__).resolve().parents[1] / "data" / "engine_logs"


def test_every_format_is_documented_with_its_source_line():
    doc = (DATA / "FORMATS.md").read_text()
    for fmt in (*MESSAGES, *((n, s, p) for n, s, p in PREFIXES)):
        source = fmt.source if hasattr(fmt, "source") else fmt[1]
        file, _, lines = source.rpartition(":")
        first = lines.split(",")[0].split("-")[0]
        assert Path(file).name in doc or file in doc, source
        assert first in doc, (source, first)


def test_every_fixture_is_read_and_its_lines_are_known():
    logs = sorted(DATA.glob("*.log"))
    assert len(logs) >= 11
    for log in logs:
        parsed = read_log(log.name, log.read_text())
        kinds = {e.kind for e in parsed.events}
        assert kinds and "other" not in kinds - {"other"}, log
