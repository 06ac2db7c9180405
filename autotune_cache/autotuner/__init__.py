"""FlashInfer's autotuner, as data (the lowest floor): token buckets, cache keys from recipes, the rank
file format, environment fingerprints, the installed versions. Nothing here imports FlashInfer
or torch, nor any engine: every engine's cache is made of these."""
