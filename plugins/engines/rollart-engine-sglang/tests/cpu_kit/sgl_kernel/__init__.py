"""TEST-ONLY stand-in for ``sgl_kernel`` (SGLang's compiled kernel package).

The published ``sglang-kernel`` wheels are CUDA builds that need the NVIDIA driver (SGLang's
CPU kernel build is not on PyPI). SGLang 0.5.23 imports names from it at module level even
on its CPU engine (``SGLANG_USE_CPU_ENGINE=1``), but on a CPU without AMX (this machine) the
Llama forward pass takes SGLang's native torch paths (``forward_native``, torch_native
attention) and calls none of them. So this stand-in provides no kernel at all: every name -
here or in any ``sgl_kernel.*`` submodule - imports, and raises ``NotImplementedError``
naming itself when called, so a code path that would need a real kernel fails loudly
instead of computing something else. (``torch.ops.sgl_kernel.*`` stays absent: SGLang
uses those only on AMX CPUs.) On PYTHONPATH only inside the plugin's ci.sh SGLang venv;
never shipped with the plugin.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.0.0+rollart-test-stand-in"


class _Missing:
    """A name the stand-in does not provide: attribute access gives another such name,
    calling it raises."""

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname
        self.__name__ = self.__qualname__ = qualname.rsplit(".", 1)[-1]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self._qualname}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{self._qualname} is not provided by rollart's test-only sgl_kernel stand-in "
            "(tests/cpu_kit/sgl_kernel); this SGLang code path needs the real kernel package"
        )

    def __repr__(self) -> str:
        return f"<missing {self._qualname}>"


def _missing(qualname: str) -> Any:
    return _Missing(qualname)


class _LazyModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any ``sgl_kernel.X.Y`` submodule exists and is a _LazyModule."""

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        module = _LazyModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):  # type: ignore[no-untyped-def]
        return None


sys.meta_path.insert(0, _Finder())


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(f"sgl_kernel.{name}")
