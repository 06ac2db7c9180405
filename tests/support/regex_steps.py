"""How much work a backtracking regex engine does on a string: a deterministic measure, not a clock.

``steps(pattern, text)`` runs ``pattern.search`` (or ``finditer``: every match, as ``sub`` scans)
in a small backtracking interpreter of Python's own parse of the pattern (``re._parser``), the
algorithm ``sre`` runs, and counts every node tried at every position. sre's optimisations (a
literal prefix scanned for, an anchored pattern tried once) only lower its work, so steps that grow
linearly with the text here grow at most linearly there. It models what doctor's patterns use:
literals, classes, ``.``, groups, alternation, greedy and lazy repeats, lookahead and lookbehind,
``^`` and ``$``; it raises on anything else rather than guess.
"""

from __future__ import annotations

import sys
import threading

try:  # Python 3.11+
    from re import _constants as C
    from re import _parser as P
except ImportError:  # 3.10
    import sre_constants as C  # type: ignore[no-redef]
    import sre_parse as P  # type: ignore[no-redef]

_CATEGORIES = {
    C.CATEGORY_DIGIT: str.isdecimal, C.CATEGORY_NOT_DIGIT: lambda c: not c.isdecimal(),
    C.CATEGORY_SPACE: lambda c: c in " \t\n\r\f\v" or c.isspace(),
    C.CATEGORY_NOT_SPACE: lambda c: not (c in " \t\n\r\f\v" or c.isspace()),
    C.CATEGORY_WORD: lambda c: c.isalnum() or c == "_", C.CATEGORY_NOT_WORD: lambda c: not (c.isalnum() or c == "_"),
}


class Unsupported(Exception):
    pass


def _char_test(op, av):
    """A predicate for a node that matches one character, or None."""
    if op is C.LITERAL:
        return lambda c: ord(c) == av
    if op is C.NOT_LITERAL:
        return lambda c: ord(c) != av
    if op is C.ANY:
        return lambda c: c != "\n"
    if op is C.IN:
        negate = bool(av) and av[0][0] is C.NEGATE
        items = av[1:] if negate else av
        tests = []
        for iop, iav in items:
            if iop is C.LITERAL:
                tests.append(lambda c, v=iav: ord(c) == v)
            elif iop is C.RANGE:
                tests.append(lambda c, lo=iav[0], hi=iav[1]: lo <= ord(c) <= hi)
            elif iop is C.CATEGORY:
                tests.append(_CATEGORIES[iav])
            else:
                raise Unsupported(iop)
        return lambda c: any(t(c) for t in tests) != negate
    return None


class _Machine:
    def __init__(self, text: str):
        self.text = text
        self.steps = 0

    def seq(self, nodes, i, pos, k):
        """Match ``nodes[i:]`` at ``pos``, then the continuation ``k``."""
        text = self.text
        while i < len(nodes):
            op, av = nodes[i]
            self.steps += 1
            test = _char_test(op, av)
            if test is not None:
                if pos < len(text) and test(text[pos]):
                    pos, i = pos + 1, i + 1
                    continue
                return False
            if op is C.AT:
                if av is C.AT_BEGINNING or av is C.AT_BEGINNING_STRING:
                    ok = pos == 0
                elif av is C.AT_END:
                    ok = pos == len(text) or (pos == len(text) - 1 and text[pos] == "\n")
                elif av is C.AT_END_STRING:
                    ok = pos == len(text)
                else:
                    raise Unsupported(av)
                if not ok:
                    return False
                i += 1
                continue
            return self.node(op, av, nodes, i, pos, k)
        return k(pos)

    def node(self, op, av, nodes, i, pos, k):
        after = lambda p: self.seq(nodes, i + 1, p, k)  # noqa: E731
        if op is C.SUBPATTERN:
            return self.seq(list(av[-1]), 0, pos, after)
        if op is C.BRANCH:
            return any(self.seq(list(alt), 0, pos, after) for alt in av[1])
        if op in (C.ASSERT, C.ASSERT_NOT):
            direction, sub = av
            if direction == 1:
                found = self.seq(list(sub), 0, pos, lambda p: True)
            else:
                width = sub.getwidth()
                if width[0] != width[1]:
                    raise Unsupported("variable-width lookbehind")
                start = pos - width[0]
                found = start >= 0 and self.seq(list(sub), 0, start, lambda p: p == pos)
            return after(pos) if found == (op is C.ASSERT) else False
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            return self.repeat(op is C.MAX_REPEAT, av, pos, after)
        raise Unsupported(op)

    def _one(self, body):
        """A test at a position for a body that always takes exactly one character: a class, or
        alternatives of such (with lookarounds), as ``_upto`` writes them. None for anything wider."""
        text = self.text
        if len(body) == 1 and (test := _char_test(*body[0])) is not None:
            return lambda p: p < len(text) and test(text[p])
        if body.getwidth() != (1, 1):
            return None
        nodes = list(body)
        return lambda p: self.seq(nodes, 0, p, lambda q: q == p + 1)

    def repeat(self, greedy, av, pos, after):
        lo, hi, body = av
        hi = len(self.text) + 1 if hi == C.MAXREPEAT else hi
        one = self._one(body)
        if one is not None:  # sre's REPEAT_ONE: run, then back off (greedy) or extend (lazy)
            def ok(p):
                self.steps += 1
                return one(p)
            if greedy:
                n = 0
                while n < hi and ok(pos + n):
                    n += 1
                for m in range(n, lo - 1, -1):
                    self.steps += 1
                    if after(pos + m):
                        return True
                return False
            n = 0
            while n < lo:
                if not ok(pos + n):
                    return False
                n += 1
            while True:
                self.steps += 1
                if after(pos + n):
                    return True
                if n >= hi or not ok(pos + n):
                    return False
                n += 1
        nodes = list(body)

        def iterate(count, p):
            self.steps += 1
            if count < lo:
                return self.seq(nodes, 0, p, lambda q: q != p and iterate(count + 1, q))
            if greedy:
                return (count < hi and self.seq(nodes, 0, p, lambda q: q != p and iterate(count + 1, q))) or after(p)
            return after(p) or (count < hi and self.seq(nodes, 0, p, lambda q: q != p and iterate(count + 1, q)))
        return iterate(0, pos)


def _run(fn):
    """Deep continuations (a repeat of a group recurses once per iteration) on a large stack."""
    out: list = []
    old = sys.getrecursionlimit()
    threading.stack_size(512 << 20)
    sys.setrecursionlimit(1_000_000)
    try:
        t = threading.Thread(target=lambda: out.append(fn()))
        t.start()
        t.join()
    finally:
        threading.stack_size(0)
        sys.setrecursionlimit(old)
    if not out:
        raise RuntimeError("the regex model failed (see the thread's traceback)")
    return out[0]


def steps(pattern, text: str, every: bool = False) -> int:
    """The work of ``pattern.search(text)`` (``every``: of ``finditer``, as ``sub`` scans) in
    nodes tried, summed over every start position."""
    tree = P.parse(pattern.pattern, pattern.flags)
    nodes = list(tree)

    def go():
        m = _Machine(text)
        pos = 0
        while pos <= len(text):
            end: list[int] = []
            if m.seq(nodes, 0, pos, lambda p: end.append(p) or True):
                if not every:
                    break
                pos = end[0] if end[0] > pos else pos + 1
            else:
                pos += 1
        return m.steps
    return _run(go)
