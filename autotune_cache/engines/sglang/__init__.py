"""SGLang 0.5.23: its flags (``serving_command``), startup checks, autotune gate, sizes,
attention and quantization rules, speculative workers, call-site recipes, planner and tree."""
