"""``pytest.importorskip`` at a test module's top level, without importing the module while collecting.

Test modules that compare our code with torch's or FlashInfer's own (``autotuner/test_buckets.py``,
``autotuner/test_fingerprint.py``, ``engines/test_v2store.py``, ``tune/workers/test_skeleton.py``,
``tune/workers/test_kernel_modules.py``), or that need the S3 stack (``tree/store/test_store.py``:
s3fs, moto, boto3), used to call ``pytest.importorskip`` at module level, so every xdist worker
imported those packages while *collecting* (~8 CPU-s per worker for torch and FlashInfer), whether
or not it then ran one of those tests.

``importorskip_lazily(name)`` keeps the skip where it was and imports nothing it need not:

- the top-level package (``torch``, ``flashinfer``) is not installed: it calls
  ``pytest.importorskip(name)`` right there, at module level, as before: the module is skipped at
  collection, visibly, with pytest's own reason (``could not import 'flashinfer.utils': No module
  named 'flashinfer'``), exactly as before. ``find_spec`` of a top-level name imports nothing.
- it is installed: it returns a stand-in whose first attribute access runs
  ``pytest.importorskip(name)`` (inside the test that needs it) and from then on is the module's
  attribute. Should the package be there but this submodule fail to import, that test is skipped
  with the same reason text (before: the whole module, at collection).
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest


class _Lazy:
    __slots__ = ("_name", "_module")

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_module", None)

    def _load(self) -> ModuleType:
        module = object.__getattribute__(self, "_module")
        if module is None:
            module = pytest.importorskip(object.__getattribute__(self, "_name"))
            object.__setattr__(self, "_module", module)
        return module

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__") and object.__getattribute__(self, "_module") is None:
            # collection probes every module-level object (``__test__``, ``__code__``...): that
            # must not import the module; no test reads a dunder of one of these modules
            raise AttributeError(attr)
        return getattr(self._load(), attr)

    def __repr__(self) -> str:
        return f"<lazily imported {object.__getattribute__(self, '_name')}>"


def importorskip_lazily(name: str):
    """What ``pytest.importorskip(name)`` at module level did, minus the import while collecting."""
    __tracebackhide__ = True  # the skip names the test module's line, as before, not this one
    if importlib.util.find_spec(name.partition(".")[0]) is None:
        return pytest.importorskip(name)  # raises: the module is skipped as before, same reason
    return _Lazy(name)
