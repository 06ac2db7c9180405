"""FlashInfer calls more than one engine makes, as recipes (floor 3, beside tree/): neutral
ground, so that no engine's package imports another's."""
