"""Development tools shared by the tests and the benchmarks (not shipped in the package): format-exact
synthetic cache entries (``synthetic``) and the concurrent worker processes of the reliability runs
(``python -m devtools.workers``). They live outside ``tests/`` because ``benchmarks/`` uses them too;
scripts reach them by putting the repository root on ``sys.path``."""
