"""One package per engine (floor 4): ``sglang/``, ``vllm/``, ``flashinfer_v2/``. Each holds its
tree layout, key, resolution, call-site recipes, planner and the options the CLI offers for it,
behind ``engines.base.Engine``; ``autotune_cache.registry`` names them. ``requests`` builds a
request from the serving options; ``selection`` says which engines a warm tunes."""
