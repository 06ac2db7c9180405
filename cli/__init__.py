"""The ``fi-autotune`` command line: thin click wrappers over ``autotune_cache``."""
