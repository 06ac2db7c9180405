"""The layouts wing, lower floor: what a tree layout is. ``base`` declares what every layout answers
(naming, listing, status, how a warm writes an entry, how ``check`` and ``verify`` read it, how it
is described); ``values`` and ``own_names`` are the words it answers in; ``memo`` remembers a
layout's answers per entry. It imports nothing of the tree above it, so the scanner, the crash-safe
writer and the store build on it. Each kind answers it on the upper floor, ``tree/layout_kinds/``
(rank files; FlashInfer's managed store), which writes through the tree's transactions and reads
through its scanner; engines subclass those in ``engines/<engine>/layout.py``; everything else
reaches a layout through ``autotune_cache.registry`` and asks it, never which kind it is."""
