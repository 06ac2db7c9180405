"""Processes run in place of what needs a GPU (tests/README.md); run as scripts or with ``python -m``."""
