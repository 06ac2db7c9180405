"""FlashInfer's own managed autotune store (``flashinfer.autotune_v2``): a FlashInfer format, not
an engine's. Its on-disk format (``format``), bundles (``bundle``), conversion from a rank-file
entry (``convert``), its tree layout (``layout``) and the object the registry names it by
(``source``: it plans nothing; SGLang's entries convert into it, a single-rank vLLM reads it).
In the layouts wing: below the engines that use it."""
