"""The parser's format table and tests/data/engine_logs/FORMATS.md name the same source lines,
and every fixture line the parser reads matches a format of the table."""

from __future__ import annotations

from pathlib import Path

from autotune_cache.logs.dialect import EVENTS
from autotune_cache.logs.formats import dialects
from autotune_cache.logs.library import LIBRARY
from autotune_cache.logs.reader import read_log

DATA = Path(__file__).resolve().parents[1] / "data" / "engine_logs"


def test_every_format_is_documented_with_its_source_line():
    doc = (DATA / "FORMATS.md").read_text()
    sources = [fmt.source for d in dialects() for fmt in d.formats] + [d.prefix_source for d in dialects()]
    assert len(sources) == 26, sources  # 5 SGLang + 8 vLLM + 10 FlashInfer formats, 3 prefixes
    for source in sources:
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


def test_each_engine_line_means_a_known_event_and_each_flashinfer_line_a_tuner_one():
    """boot folds events, not engine-named kinds: an engine's format that means something else
    would be read as nothing at all."""
    for d in dialects():
        for fmt in d.formats:
            assert fmt.event.startswith("tuner.") if d is LIBRARY else fmt.event in EVENTS, (d, fmt.name)
