"""The crash-safety wing: how a write and a delete stay whole, whatever kills the process.

Engines read without locks, so every file and every entry appears whole or not at all:

* a file is written to a temp name, fsynced and renamed (``atomic``);
* an entry is assembled in a staging dir, and a ``Transaction`` (``txn``) checks it under the
  entry locks (``locks``: flock plus an owner token whose death anyone can see), journals the
  decision, then swaps each target in one step (``swap``: ``renameat2(RENAME_EXCHANGE)`` or two
  renames);
* a delete (``tree/delete.py``) renames every entry of its plan to a trash dir first, journals
  the plan once all are in trash, then removes the trash and the journal last;
* whatever a killed writer or deleter left - a transaction journal, a delete journal, staging
  and trash dirs of a dead owner - the next *writer* finishes once per command (``recovery``);
  readers (``ls``, ``show``, ``export``, ``push``) read the tree as it is and report it;
* ``dirs`` removes trees without following links; ``faults`` is where a test launcher injects a
  kill at a named step (the library itself reads no environment for it).
"""
