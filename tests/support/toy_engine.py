"""A test-only engine: the whole of what adding an engine takes (this module, and one
``registry.register_engine`` line in the test that uses it).

It reads SGLang's rank files from a tree of its own (``$TOY_CACHE_DIR/toy-autotune/...``) and
tunes what SGLang's startup pass tunes, and it logs its boot in a dialect of its own (``ToyLines``:
``doctor`` reads it with nothing else changed); nothing of fi-autotune names it.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from autotune_cache.logs.dialect import LogDialect, line_format
from autotune_cache.plan.engine import Engine
from autotune_cache.engines.sglang.layout import SGLangLayout
from autotune_cache.engines.sglang.planner import make_plan
from autotune_cache.tree.layouts.base import env_root
from autotune_cache.tree.layouts.values import RootChoice


class ToyLayout(SGLangLayout):
    name = "toy"
    engine = "Toy"
    description = "Toy: $TOY_CACHE_DIR/toy-autotune/<version>/<arch>/<key>/rank_*.json"

    def default_root(self) -> RootChoice:
        return env_root("TOY_CACHE_DIR", "~/.cache/toy")

    def base_parts(self) -> tuple[str, ...]:
        return ("toy-autotune",)


class ToyLines(LogDialect):
    """``<toy rank=1 12:00:01> toy: autotune reading /srv/toy/toy-autotune/.../rank_tp1_pp0_dp0.json``"""

    name = "toy"
    label = "Toy"
    release = "1.0"
    prefix = re.compile(r"<toy rank=(?P<rank>\d+) (?P<ts>\d\d:\d\d:\d\d)> ")
    prefix_source = "toy/log.py:1"
    formats = (
        line_format("toy.reading", "pass.open", "toy/boot.py:10", r"^toy: autotune reading (?P<path>\S+)$"),
        line_format("toy.done", "pass.end", "toy/boot.py:20", r"^toy: autotune done$"),
        line_format("toy.version", "server.version", "toy/boot.py:1", r"^toy: version (?P<version>\S+)$"),
    )
    default_root = ".cache/toy"
    command_placeholder = "toy-serve <the server's flags>"

    def rank_of(self, prefix: re.Match) -> str | None:
        return f"toy{prefix['rank']}"


class Toy(Engine):
    name = "toy"
    label = "Toy"
    title = "Toy 1.0"

    layouts = (ToyLayout(),)
    log_dialect = ToyLines()

    def plan(self, request, cache_root: Path):
        r = request
        plan = make_plan(r.model, r.flags, r.arch, config=r.config, revision=r.revision, schema=r.schema,
                         flashinfer_version=r.flashinfer_version, cache_root=cache_root, max_tokens=r.max_tokens,
                         model_path=r.model_path, request=request)
        return replace(plan, layout=self.layouts[0].name)

    def describe(self, plan):
        return [("Toy pass", f"{plan.profiles} profiles, key {plan.key}")]


ENGINE = Toy()
