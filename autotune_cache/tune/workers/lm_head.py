"""Skip the LM head during an autotune dummy pass: ``lm_head_stub()``.

An engine's autotune dummy forward has no use for logits, yet the LM head computes
``[tokens x dp, vocab]`` of them and all-gathers them over TP, which on big-vocab MoE models
is the largest buffer of the whole pass (GLM-5.1-FP8 TP8 DP8 on B200 ran out of memory right
there). Inside ``with lm_head_stub(...)``:

* every module passed in (an ``nn.Linear`` LM head, an engine's logits processor, ...) has its
  ``forward`` replaced by one that returns an empty ``[tokens, 0]`` tensor, then restored;
* code that cannot be handed over as a module can ask ``lm_head_stubbed()`` and return early,
  as fi-autotune's skeleton LM head and SGLang's ``autotune_dummy_run_mode(run_lm_head=False)`` do.

For engine integrations::

    with flashinfer.autotune(True, cache=path), autotune_cache.lm_head_stub(model.lm_head):
        model(dummy_batch)

It imports nothing heavy: torch is only touched when a stubbed forward runs.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

_STUBBED: contextvars.ContextVar[bool] = contextvars.ContextVar("fi_autotune_lm_head_stubbed", default=False)


def lm_head_stubbed() -> bool:
    """True inside ``lm_head_stub()``: an LM head should return without computing logits."""
    return _STUBBED.get()


def empty_logits_like(hidden: Any) -> Any:
    """``[tokens, 0]`` on the hidden states' device and dtype: shape-compatible, zero bytes."""
    return hidden.new_empty((hidden.shape[0], 0))


def _stub_forward(*args: Any, **kwargs: Any) -> Any:
    hidden = args[0] if args else next(iter(kwargs.values()))
    return empty_logits_like(hidden)


@contextlib.contextmanager
def lm_head_stub(*modules: Any) -> Iterator[None]:
    """Short-circuit LM heads for the duration of the block (re-entrant, exception-safe)."""
    token = _STUBBED.set(True)
    patched = []
    try:
        for module in modules:
            # An instance attribute shadows the class's forward; removing it restores the original.
            had_own = "forward" in vars(module)
            patched.append((module, had_own, vars(module).get("forward")))
            module.forward = _stub_forward
        yield
    finally:
        for module, had_own, original in reversed(patched):
            if had_own:
                module.forward = original
            else:
                del module.forward
        _STUBBED.reset(token)
