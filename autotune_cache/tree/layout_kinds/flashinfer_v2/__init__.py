"""FlashInfer's own managed autotune store (``flashinfer.autotune_v2``): a FlashInfer format, not
an engine's. Its on-disk format (``format``), bundles (``bundle``), conversion from a rank-file
entry (``convert``) and its tree layout (``layout``, whose ``LAYOUT`` the registry names; it plans
nothing: SGLang's entries convert into it, a single-rank vLLM reads it).
The layouts wing's upper floor (``tree/layout_kinds/``): below the engines that use it."""
