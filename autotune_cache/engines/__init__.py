"""One package per engine: ``sglang/``, ``vllm/`` (FlashInfer's managed store, which no engine
owns, is ``tree/layout_kinds/flashinfer_v2/``). Each holds its tree layout, key, resolution, call-site recipes,
planner, the options the CLI offers for it and the serving command it rebuilds from its logged
arguments, behind ``plan.engine.Engine``; ``autotune_cache.registry`` names them. ``requests`` builds a
request from the serving options; ``selection`` says which engines a warm tunes."""
