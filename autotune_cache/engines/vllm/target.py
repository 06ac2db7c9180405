"""The vLLM part of a request: vLLM's config hash (its cache dir's name), its token budget, its tree."""

from __future__ import annotations

import re
from dataclasses import dataclass

from autotune_cache.errors import UsageError
from autotune_cache.plan.engine_target import EngineTarget

#: ``SchedulerConfig.max_num_batched_tokens`` of ``vllm serve`` on an 80-141 GB GPU.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


def default_max_num_batched_tokens(arch: str) -> int:
    """``vllm serve``'s token budget when none is given (``EngineArgs.get_batch_defaults``, the
    OpenAI server's): 16384 on a GPU of 160 GiB or more, 8192 from 70 GiB (not an A100), else
    2048. By arch, for the GPUs fi-autotune plans for: Blackwell data-centre GPUs (B200, B300,
    GB200: sm100/sm103) have 180 GB or more, Hopper's (H100, H200: sm90) 80-141 GB
    (``tests/data/vllm-0.33.0/matrix.json``: 8192 on a fake H100, 16384 on a fake B200)."""
    return 16384 if arch.startswith(("sm100", "sm103")) else DEFAULT_MAX_NUM_BATCHED_TOKENS
_HASH_IN_TEXT = re.compile(r"(?<![0-9a-z])([0-9a-f]{64})(?![0-9a-z])")
#: The levels above the hash in the path vLLM prints: ``flashinfer_autotune_cache/<version>/<arch dir>/<hash>``.
_PATH_LEVELS = re.compile(r"flashinfer_autotune_cache/([^/\s]+)/([^/\s]+)/([0-9a-f]{64})(?![0-9a-z])")
LAYOUTS = ("vllm", "vllm-dir")  # vllm-dir: $VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR


@dataclass(frozen=True)
class VllmTarget(EngineTarget):
    """What only the vLLM side of a request has."""

    config_hash: str = ""  # "": not given (a single-rank vLLM needs none)
    max_num_batched_tokens: int | None = None  # None: vLLM's default for the GPU (the plan resolves it)
    #: "<version>/<arch dir>" of the path vLLM printed with the hash, if it was pasted ("" else).
    printed_at: str = ""

    @classmethod
    def of(cls, config_hash: str, max_num_batched_tokens: int | None = None,
           layout: str = "vllm", printed_at: str = "") -> "VllmTarget":
        return cls("vllm", layout, config_hash, max_num_batched_tokens, printed_at)

    def budget(self, arch: str) -> int:
        """The token budget the server tunes up to: the one given, else vLLM's default on ``arch``."""
        return self.max_num_batched_tokens or default_max_num_batched_tokens(arch)

    def options(self) -> dict:
        return {"config_hash": self.config_hash, "max_num_batched_tokens": self.max_num_batched_tokens,
                "layout": self.layout, **({"printed_at": self.printed_at} if self.printed_at else {})}

    @classmethod
    def from_dict(cls, d: object) -> "VllmTarget":
        if not isinstance(d, dict):
            raise ValueError("request.vllm is not an object")
        h, n, layout = d.get("config_hash"), d.get("max_num_batched_tokens"), d.get("layout", "vllm")
        if not isinstance(h, str) or not re.fullmatch("(?:[0-9a-f]{64})?", h):
            raise ValueError("request.vllm.config_hash is not 64 hex digits (or empty: a single rank's)")
        if (n is not None and (type(n) is not int or n < 1)) or layout not in LAYOUTS:
            raise ValueError("request.vllm has an invalid max_num_batched_tokens or layout")
        printed_at = d.get("printed_at", "")
        if not isinstance(printed_at, str):
            raise ValueError("request.vllm.printed_at is not a string")
        return cls.of(h, n, layout, printed_at)


def parse_config_hash(text: str) -> str:
    """The 64-hex config hash from what the user pasted: the hash itself, the cache file path, or
    vLLM's whole startup line ("Using FlashInfer autotune cache file: .../<hash>/autotune_...")."""
    found = set(_HASH_IN_TEXT.findall(text.strip().lower()))
    if len(found) != 1:
        raise UsageError(
            f"--vllm-config-hash {text[:80]!r}: give the 64-hex hash vLLM prints at startup (\"Using FlashInfer "
            "autotune cache file: .../<hash>/autotune_configs_dp0_rank0.json\"), or that path")
    return found.pop()


def printed_levels(text: str) -> tuple[str, str] | None:
    """(FlashInfer version, arch dir) of the path vLLM printed with the hash, when it printed the
    full path (not with ``$VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR``, which drops both): the provenance
    the planner checks against its own."""
    m = _PATH_LEVELS.search(text.strip().lower())
    return (m[1], m[2]) if m else None
