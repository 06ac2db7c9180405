"""vLLM 0.33: its target options (config hash, token budget), planner and per-rank tree."""
