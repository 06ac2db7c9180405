"""The scanner wing: reading a tree into frozen records (``scan``: the whole tree or a stream of
batches; ``entry_scan``: one entry dir; ``walk``: finding entry dirs by the layout's levels),
the on-disk digest index that keeps re-scans proportional to what changed (``digestindex``) and
whether the filesystem keeps access times (``atime``). It reads only: never a lock, never a write
outside its own index."""
