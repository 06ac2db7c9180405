"""The package's version, on the bottom floor: manifests and store records stamp it, and they
sit below the package's ``__init__`` (which re-exports it), so they import it from here."""

__version__ = "0.2.0"
