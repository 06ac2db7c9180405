"""What a user asks for, typed: config sources, the model spec, topologies, serving
options and flags, the request, an engine's resolution and the tuning plan's types. The
engines (``engines/``) compute resolutions and plans from these; the tree and the tuner read them."""
