"""Public names that load on first use (PEP 562), so importing a package stays free of torch and gymnasium
until a name that needs them is asked for."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, namespace: dict[str, Any], exports: dict[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: ``exports`` maps a public name to its module.

    >>> namespace = {}
    >>> getattr_, dir_ = lazy_exports("demo", namespace, {"OrderedDict": "collections"})
    >>> getattr_("OrderedDict").__name__, "OrderedDict" in namespace, dir_()
    ('OrderedDict', True, ['OrderedDict'])
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # kept, so the module loads once
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
