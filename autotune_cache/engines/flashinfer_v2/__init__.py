"""FlashInfer's own managed store (``autotune_v2``): its layout, writer and conversion from an
SGLang entry. It plans nothing itself."""
