"""Two kinds of failure, because the CLI maps them to different exit codes (2 and 1)."""


class FiAutotuneError(Exception):
    """A command could not do its job (exit 1): bad archive, refused overwrite, I/O error."""


class UsageError(FiAutotuneError):
    """The request itself is wrong (exit 2): unknown schema, impossible topology, bad size."""


class EntryLocked(FiAutotuneError):
    """Another writer holds the key dir's lock."""
