"""Run inside an interpreter that has vLLM (the serving image, or a CPU venv with vLLM 0.33):
print, as JSON, where vLLM's own functions put FlashInfer autotune files for this environment.
Used by tests/engines/test_vllm_layout.py when $FI_AUTOTUNE_VLLM_PYTHON names such an interpreter."""

import json
import sys

import vllm
from vllm.model_executor.warmup.flashinfer_autotune_cache import (
    flashinfer_autotune_filename,
    flashinfer_autotune_root,
    resolve_flashinfer_autotune_v2_root,
)

pairs = json.loads(sys.argv[1])
v2 = resolve_flashinfer_autotune_v2_root()
print(json.dumps({
    "vllm": vllm.__version__,
    "root": str(flashinfer_autotune_root()),
    "v2_root": None if v2 is None else str(v2),
    "files": [flashinfer_autotune_filename(d, r) for d, r in pairs],
}))
