"""The layouts wing, upper floor: each kind of tree answering the contract of ``tree/layouts/``.
``rank_files`` for trees of one rank file per rank (SGLang's, vLLM's); ``flashinfer_v2/`` for
FlashInfer's own managed store. A kind writes through the tree's crash-safe transactions
(``tree/writer.py``, ``tree/crashsafe/``) and reads an entry through the scanner, so it sits above
them; nothing in the tree imports a kind: the registry names them, engines subclass them."""
