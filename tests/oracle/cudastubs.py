"""Stand-ins for compiled CUDA extension packages that cannot load without a GPU driver.

SGLang imports ``sgl_kernel`` (a CUDA .so) at module level on paths the oracle needs (quantization
configs, model config). On a serving machine it is installed, so every ``from sgl_kernel import X``
succeeds there; here the stub answers the same way, and a *call* into it raises, so a recorded
result can never silently depend on a kernel that did not run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

STUBBED = ("sgl_kernel",)


class KernelCalled(RuntimeError):
    pass


class _Kernel:
    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise KernelCalled(f"CUDA kernel {self._name} called in the CPU oracle")

    def __getattr__(self, item: str):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Kernel(f"{self._name}.{item}")

    def __mro_entries__(self, bases):
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, item: str):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Kernel(f"{self.__name__}.{item}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.4.10"  # sglang 0.5.23 pins sglang-kernel==0.4.10
        return module

    def exec_module(self, module):
        pass


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
