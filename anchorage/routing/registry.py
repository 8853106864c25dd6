"""Router registry: names -> constructors, ``make_router(name, **params)``.

Every module in this package may define ``ROUTERS = {name: factory}``; factories take
keyword parameters only. Modules are discovered on first use, so adding a router is
adding one file. Bad names or parameters raise ``ValueError`` with a clear message.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from anchorage.routing.base import Router

_ROUTERS: dict[str, Callable[..., Router]] = {}
_NOT_ROUTERS = {"base", "registry", "scorers", "events", "keys", "load", "prefix_index", "metadata", "bounded",
                "vllm_events", "analysis", "oracle"}


def _load() -> None:
    if _ROUTERS:
        return
    import anchorage.routing as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name in _NOT_ROUTERS or info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"anchorage.routing.{info.name}")
        _ROUTERS.update(getattr(mod, "ROUTERS", {}))


def router_names() -> list[str]:
    _load()
    return list(_ROUTERS)


def make_router(name: str, **params: Any) -> Router:
    _load()
    if name not in _ROUTERS:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(router_names())}")
    try:
        return _ROUTERS[name](**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for router {name!r}: {exc}") from None
