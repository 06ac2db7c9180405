"""What an engine's startup log says, as data each engine hands ``doctor``: its dialect.

``doctor`` reads FlashInfer's own lines (``library``) the same under every engine; what an
engine adds - its line prefix and how a rank is named there, the lines that open and close an
autotune pass, its version line, how its ranks tune (in step or not), the words for its own
causes and the command that fixes them - lives in that engine's package (``engines/<e>/
log_lines.py``) as a ``LogDialect`` and reaches ``logs/`` through the registry only. Nothing in
``logs/`` names an engine (``tests/test_architecture.py`` holds it so); adding an engine to
doctor is one dialect in its package (the toy engine in ``tests/logs/test_dialects.py``).

An engine's lines become *events* with the meanings below, not engine-named kinds: ``boot``
folds events into passes the same way for every engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:  # the types a dialect is handed; nothing here runs them
    from autotune_cache.logs.trees import Located, Trees
    from autotune_cache.plan.entry_key import KeyFields


class Server(Protocol):
    """What a dialect reads of a server being assembled (``boot.Server``): the ranks seen so far
    (label -> their passes) and the arguments it logged."""

    ranks: dict
    server_args: dict | None

#: What an engine's line can mean to ``boot`` (a format's ``event``), and the fields it carries.
EVENTS = {
    "pass.open": "an autotune pass opens on this rank, reading the cache file `path`",
    "pass.open_fresh": "a pass opens that ignores its cache and writes `path` afresh (reuse turned off)",
    "pass.open_managed": "a pass opens on FlashInfer's managed store (its directory is named later)",
    "pass.end": "this rank's open pass ends",
    "pass.dummy": "this rank runs the tuning pass (the engine says so: nothing was a hit)",
    "ranks.disagree": "the ranks' cache files differed and were dropped: the rank's group tunes again",
    "server.args": "`args`: the server's arguments, a Python dict's repr",
    "server.version": "`version`: the engine's release",
    "autotune.off": "the engine skips autotuning (recognised, nothing follows from it)",
}


@dataclass(frozen=True)
class LineFormat:
    """One message a log shows: its name (``<who>.<what>``, for tests and FORMATS.md), what it
    means to ``boot`` (an ``EVENTS`` key, or a ``tuner.*`` kind for FlashInfer's own lines),
    where it is printed (file:line in the release the dialect reads), and its pattern."""

    name: str
    event: str
    source: str
    pattern: re.Pattern


def line_format(name: str, event: str, source: str, pattern: str) -> LineFormat:
    return LineFormat(name, event, source, re.compile(pattern))


# Every pattern runs in time linear in the line (a log line may be megabytes: tqdm's redraws, a
# hostile file): no lazy quantifier, no unbounded repeat inside another, and a field that runs up
# to a delimiter is a run of characters that are not the delimiter's start, or that start and not
# the whole delimiter (``upto``) - one way to read each character, nothing to backtrack into.
# tests/logs/test_linear_patterns.py counts the work on megabyte lines of each one's worst case.

#: A field to the end of the line, less trailing whitespace (a path that is only whitespace keeps
#: its first character, as ``.+?\s*$`` did): a greedy run backs off once, to the last non-space.
TO_EOL = r"(?P<path>.*\S|.)\s*$"


def upto(name: str, delimiter: str, repeat: str = "*") -> str:
    """A field named ``name`` running up to the first ``delimiter`` (a regex of fixed text whose
    first character is a literal), then the delimiter: each character is either not the
    delimiter's first one, or is and does not start the whole delimiter (a lookahead of fixed
    length). The same text ``(?P<name>.*?)delimiter`` matches, without its backtracking."""
    first = delimiter[:2] if delimiter.startswith("\\") else delimiter[0]
    rest = delimiter[len(first):]
    return f"(?P<{name}>(?:[^{first}]|{first}(?!{rest})){repeat}){delimiter}"


class LogDialect:
    """One engine's startup log. Subclasses set the class attributes and override what differs;
    the defaults describe an engine whose ranks each open, tune and close their own pass."""

    #: the engine's registry name (``Session.engine``, ``Server.engine``) and how a person names it
    name: ClassVar[str]
    label: ClassVar[str]
    #: the release whose source these formats were copied from; a log of another is read, with a warning
    release: ClassVar[str]
    #: the engine's line prefix, where its source prints it, and the formats of its messages
    prefix: ClassVar[re.Pattern]
    prefix_source: ClassVar[str]
    formats: ClassVar[tuple[LineFormat, ...]] = ()
    #: the tail of the engine's default cache root (``.cache/<engine>`` under a home); a server
    #: root ending in it needs no ``--cache-dir`` in a fix
    default_root: ClassVar[str | None] = None
    #: the serving command, for a fix where the log does not state it
    command_placeholder: ClassVar[str] = "<the server's command>"
    #: the ``warm`` option that carries a key only the engine computes (its value: the entry's
    #: name); such a key cannot be rebuilt from key fields, only from the server's own command
    key_option: ClassVar[str | None] = None
    #: the engine prints no end of a pass: each ends with the log
    passes_end_with_log: ClassVar[bool] = False
    #: only the leader names the cache; the other ranks read the same entry
    leader_names_cache: ClassVar[bool] = False
    #: the ranks tune in step, each printing its own bar of every op (time is one rank's, not the sum)
    ranks_in_lockstep: ClassVar[bool] = False
    #: a pass that opened with reuse turned off: (the cause, the command that turns it back on)
    reuse_off: ClassVar[tuple[str, str]] = ("the engine turned cache reuse off: every boot tunes from scratch",
                                            "turn cache reuse back on in the server's environment")
    #: ``ranks.disagree``: what the engine did, and (``{ep}`` filled) a note where expert
    #: parallelism makes the engine's own files differ at every boot
    diverged: ClassVar[str] = "the ranks' cache files differed, so the engine dropped them and tuned from scratch"
    diverged_ep_note: ClassVar[str | None] = None

    def rank_of(self, prefix: re.Match) -> str | None:
        """The rank a line's prefix names (None: the line carries none)."""
        return None

    def rank_group(self, rank: str) -> str:
        """The group of ranks that tunes again with ``rank`` when their files disagree."""
        return rank

    def rank_of_file(self, server: Server, path: str) -> tuple[str, bool] | None:
        """Where each rank reads a file of its own named after it: the label of the rank that
        reads ``path``, and whether it is the first rank; None where ``path`` is not such a file."""
        return None

    def lockstep_ranks(self, server: Server) -> int:
        """How many ranks print a bar of each op in step (their bars are divided, not added)."""
        return 1

    def ep_size(self, args: dict | None) -> int | None:
        """The expert-parallel size the server's logged arguments state."""
        return None

    def explain_key_miss(self, trees: Trees, loc: Located, args: dict | None) -> tuple[str | None, KeyFields | None]:
        """Why the server's entry is not in our tree, and the key fields the server used where
        they can be rebuilt: an entry of the same name under another version or arch directory,
        else ``opaque_key_note``."""
        same = [c for c in trees.candidates(loc.layout) if c.id.name == loc.id.name]
        if same:
            return f"the nearest entry, {same[0].id}, differs in FlashInfer version or arch", None
        return self.opaque_key_note, None

    #: why a key the engine alone computes differs, where no entry of its name is ours
    opaque_key_note: ClassVar[str | None] = None

    def __repr__(self) -> str:
        return f"<log dialect {self.name}>"
