"""The reliability benchmark's families, a module each; ``benchmarks/reliability.py`` runs them."""
