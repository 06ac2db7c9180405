"""Careful tuning: where each tune's results are saved and merged (``workdir``: the quick mode's
single tune too, since selection reads them back), how several tunes' disagreements are raced
(``race``: interleaved, CUDA-graph timing), which tactic is written (``quality``: the selection
rules; ``careful``: the races and the pair round planned over a run's work dirs), and the
exhaustive reference careful is measured against (``exhaustive``)."""
