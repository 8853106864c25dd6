"""Policy registry: names -> constructors. Offline policies get the replay's contexts.

Every module in this package may define ``POLICIES = {name: factory}`` (online) and
``OFFLINE_POLICIES = {name: factory}`` (reads the future; simulator only). Factories are
called as ``factory(block_size=..., **params)``; offline ones also get ``contexts=``.
Modules are discovered on first use, so adding a policy is adding one file (the
``group`` package is the engine behind the group-scored presets, not a policy).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

from anchorage.policies.base import EvictionPolicy, RequestContext, UnknownParameterError

_ONLINE: dict[str, Callable[..., EvictionPolicy]] = {}
_OFFLINE: dict[str, Callable[..., EvictionPolicy]] = {}


def _load_builtins() -> None:
    if _ONLINE:
        return
    from anchorage.policies import belady, lru

    _ONLINE["lru"] = lambda block_size=16, **params: lru.LRUPolicy(**params)

    def _belady(contexts: Sequence[RequestContext], block_size: int, **params: Any):
        limits = [max(0, (c.input_length - 1) // block_size) for c in contexts]
        return belady.BeladyPolicy([c.keys for c in contexts], limits,
                                   [c.input_length for c in contexts])

    _OFFLINE["belady"] = _belady
    import importlib
    import pkgutil

    import anchorage.policies as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name in ("base", "registry", "lru", "belady", "group") or info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"anchorage.policies.{info.name}")
        _ONLINE.update(getattr(mod, "POLICIES", {}))
        _OFFLINE.update(getattr(mod, "OFFLINE_POLICIES", {}))


def policy_names(include_offline: bool = True) -> list[str]:
    _load_builtins()
    names = list(_ONLINE)
    if include_offline:
        names += list(_OFFLINE)
    return names


def is_offline(name: str) -> bool:
    _load_builtins()
    return name in _OFFLINE


def make_policy(name: str, *, block_size: int = 16,
                contexts: Sequence[RequestContext] | None = None,
                params: dict[str, Any] | None = None, **kwargs: Any) -> EvictionPolicy:
    """Build a policy by name. Offline policies (``belady``...) need ``contexts``.
    Parameters come as ``params`` or keyword arguments (both merged, keywords win); a
    parameter the policy does not take is a TypeError naming it, a bad value a ValueError."""
    _load_builtins()
    params = dict(params or {}, **kwargs)
    if name in _ONLINE:
        return _call(name, _ONLINE[name], block_size=block_size, **params)
    if name in _OFFLINE:
        if contexts is None:
            raise ValueError(f"policy {name!r} reads the future: it needs the whole replay")
        return _call(name, _OFFLINE[name], contexts=contexts, block_size=block_size, **params)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(policy_names())}")


def _call(name: str, factory: Callable[..., EvictionPolicy], **params: Any) -> EvictionPolicy:
    try:
        return factory(**params)
    except UnknownParameterError as e:
        raise TypeError(f"policy {name!r} does not accept parameter {e.name!r}") from None
    except TypeError as e:
        m = re.search(r"unexpected keyword argument '(\w+)'", str(e))
        if m:
            raise TypeError(f"policy {name!r} does not accept parameter {m.group(1)!r}") from None
        raise
