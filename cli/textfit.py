"""Text fitted to a terminal width: a table's widest column cut until the table fits, an entry
id cut in its key, a paragraph wrapped, and a command wrapped over lines that paste as they are
(`` \\`` at each end, a flag kept with its value)."""

from __future__ import annotations

import textwrap


def short_entry(entry: str | None, width: int = 36) -> str:
    """An entry id, its key cut to fit (a vLLM key is 64 hex digits): ``vllm:0.7.2.post1/90a/3f1c0e8a9b7d…``."""
    if not entry or len(entry) <= width:
        return entry or "-"
    head, _, key = entry.rpartition("/")
    keep = max(8, width - len(head) - 2)
    return f"{head}/{key[:keep]}…" if head else entry[: width - 1] + "…"


def fit_columns(rows: list[list[str]], headers: list[str], width: int) -> list[list[str]]:
    """Cut the widest column's cells (with an ellipsis) until the table fits ``width``."""
    rows = [list(r) for r in rows]
    while True:
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
        if sum(widths) + 2 * (len(widths) - 1) <= width:
            return rows
        i = max(range(len(widths)), key=widths.__getitem__)
        cut = widths[i] - (sum(widths) + 2 * (len(widths) - 1) - width)
        cut = max(cut, len(headers[i]), 4)
        if cut >= widths[i]:
            return rows
        for r in rows:
            if len(r[i]) > cut:
                r[i] = r[i][: cut - 1] + "…"


def wrap_text(text: str, first: str, rest: str = "      ", width: int = 100) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False,
                         break_long_words=False) or [first.rstrip()]


def wrap_command(command: str, indent: str = "      ", width: int = 100) -> list[str]:
    """A command over several lines, each ending in `` \\`` but the last, to paste as it is."""
    lines, cur = [], indent
    words: list[str] = []
    for word in command.split(" "):  # a flag and its value stay on one line, where that line fits
        if (words and words[-1].startswith("-") and not word.startswith("-") and words[-1] != "--"
                and len(indent) + 2 + len(words[-1]) + 1 + len(word) + 2 <= width):
            words[-1] += " " + word
        else:
            words.append(word)
    for word in words:
        if cur.strip() and len(cur) + 1 + len(word) + 2 > width:
            lines.append(cur + " \\")
            cur = indent + "  " + word
        else:
            cur = (cur + " " + word) if cur.strip() else cur + word
    return [*lines, cur]
