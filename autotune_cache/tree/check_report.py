"""What ``check`` found for one plan's entry: the report every layout's check fills.

Below the layouts that fill it (a tree of rank files is checked file by file in ``check.py``;
FlashInfer's managed store by its own layout), so the verdict has one shape whichever answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CheckReport:
    entry_id: str
    where: str  # the key dir, or store URL + id
    autotunes: bool
    found: bool = False
    misses: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    keys_checked: int = 0
    keys_missing: int = 0
    rank_files: int = 0
    #: Under ``check --strict`` what cannot be checked is a miss: a gate never passes on an unknown.
    strict: bool = False

    @property
    def ok(self) -> bool:
        return not self.misses

    def cannot_check(self, why: str) -> None:
        """Something the verdict depends on is unknown: a miss under --strict, else a warning."""
        (self.misses if self.strict else self.warnings).append(why)

    def to_dict(self) -> dict:
        return {"entry": self.entry_id, "where": self.where, "autotunes": self.autotunes, "found": self.found,
                "ok": self.ok, "misses": self.misses, "warnings": self.warnings, "keys_checked": self.keys_checked,
                "keys_missing": self.keys_missing, "rank_files": self.rank_files}


def checkable(op, report: CheckReport) -> bool:
    """Whether ``op``'s predicted keys can be trusted: run on a GPU, or built by FlashInfer's own
    key construction from SGLang's own call (tests/data/sglang-0.5.23, on CPU)."""
    if op.recipe.verified or op.recipe.keys_checked:
        return True
    report.warnings.append(f"{op.recipe.id}: its keys cannot be checked (neither run on a GPU nor recorded "
                           "from SGLang's and FlashInfer's own code)")
    return False
