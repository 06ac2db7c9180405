"""GPU arch names as FlashInfer and the engines spell them in cache paths: ``sm<major><minor>``.

One home for the spelling, below every engine: SGLang names its arch directory so
(``f"sm{major}{minor}"`` from ``torch.cuda.get_device_capability``), FlashInfer's JIT and our
``--arch`` option use the same form, and the tree scanner, ``key`` and the GPU probe all check it.
vLLM's own directory name (``90a``) is vLLM's, and stays with vLLM's layout.
"""

from __future__ import annotations

import re

#: ``sm90``, ``sm100``, ``sm100a``: what a cache path's arch level and ``--arch`` accept.
ARCH_RE = re.compile(r"^sm[0-9]{2,3}[a-z]?\Z")


def arch_from_capability(major: int, minor: int) -> str:
    """SGLang's and FlashInfer's name for a compute capability: ``(9, 0)`` -> ``sm90``."""
    return f"sm{major}{minor}"
