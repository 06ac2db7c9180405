"""FlashInfer calls more than one engine makes, as recipes: neutral
ground, so that no engine's package imports another's."""
