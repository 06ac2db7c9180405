"""The layouts wing: everything a tree layout is. ``base`` declares what every layout answers
(naming, listing, status, how a warm writes an entry, how ``check`` and ``verify`` read it, how it
is described); ``rank_files`` answers it for trees of one rank file per rank (SGLang's, vLLM's);
``flashinfer_v2/`` for FlashInfer's own managed store; ``memo`` remembers a layout's answers per
entry. Engines subclass these in ``engines/<engine>/layout.py``; everything else reaches a layout
through ``autotune_cache.registry`` and asks it, never which kind it is."""
