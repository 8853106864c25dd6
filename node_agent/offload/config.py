"""The host tier's configuration, read from vLLM's ``--kv-transfer-config`` (one place,
checked once at start: a bad value stops the engine with an error naming the field).

Specification
-------------
``kv_connector_extra_config`` keys vLLM reads itself (``OffloadingConnector`` and
``CPUOffloadingSpec``): ``cpu_bytes_to_use`` (required, an integer > 0: the host memory
the tier may use, never exceeded), ``block_size`` / ``blocks_per_chunk``,
``eviction_policy`` + ``cache_policy_module_path`` (the host-tier policy: vLLM's ``lru``
or ``arc``, or Anchorage's ``AnchorageCachePolicy`` from
``anchorage.node_agent.offload.policy``), ``spec_name`` + ``spec_module_path``,
``store_threshold``, ``offload_prompt_only``. Checked here: ``cpu_bytes_to_use``.

Anchorage's keys, under ``kv_connector_extra_config["anchorage"]`` (an object; every key
optional; an unknown key is an error naming it):

- ``enabled`` (bool, default true): false, or the Anchorage plugin off
  (``ANCHORAGE_POLICY`` unset or ``off``), leaves the connector and the policy exactly
  vLLM's (the policy is vLLM's LRU);
- ``transfer_timeout_s`` (number > 0, default none): a host copy slower than this fails
  (it is recomputed; the CPU transfer worker only);
- ``reload_ahead`` (bool, default true): the temporal controller plans each tool stall
  (its gate protects the session's host copy) and lists just-in-time reloads;
- ``link_gbs`` (number > 0, default 25): the host link's bandwidth each way, GB/s, for the
  controller's transfer estimates;
- ``state_dir`` (string, default ``ANCHORAGE_STATE_DIR`` or ``/tmp/anchorage``): where the
  host tier's snapshot (``host_tier.json``) goes for the sidecar;
- ``snapshot_interval_s`` (number > 0, default 0.5);
- ``node_pool_dir`` (string, default none: off): the node pool's directory, shared by the
  node's engines (a tmpfs; ``anchorage.node_agent.offload.node_pool``): this engine's host
  tier lives there and the node's other engines (same model and KV layout) read it, as it
  reads theirs. Works with Anchorage's spec only (its CPU transfer worker then runs on every
  platform); a directory that cannot be created or written stops the engine, naming it;
- ``node_pool_growth`` (integer >= 1, default 4): with the node pool, how far past its own
  ``cpu_bytes_to_use`` this engine's host tier may grow while the node's engines hold less
  than the sum of theirs (the node-wide LRU: ``pool_manager``); 1 keeps each engine within
  its own. The engine's memory then varies up to this many times ``cpu_bytes_to_use``
  (the pages of the chunks it holds), the node's total stays the sum;
- ``sync_load_max_ms`` (number >= 0, default 0: off, ``anchorage.tiering.loads``'s
  default and why): a host hit whose copy (its bytes over
  ``link_gbs``; with the step's other synchronous copies) takes at most this long is
  loaded in the step that schedules its request, before the forward pass, and the
  request is prefilled in that step; a larger one is loaded between steps, as vLLM
  loads every hit. 0 loads every hit as vLLM does.

With ``AnchorageOffloadingConnector``, vLLM's ``kv_load_failure_policy`` must be
``recompute`` (a failed load is then recomputed and the request completes).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from anchorage.tiering.loads import SYNC_LOAD_MAX_S

FIELD = "kv_connector_extra_config"


class HostTierConfigError(ValueError):
    """A bad host-tier configuration (the message names the field)."""


@dataclass(frozen=True)
class OffloadConfig:
    enabled: bool = True
    transfer_timeout_s: float | None = None
    reload_ahead: bool = True
    link_gbs: float = 25.0
    state_dir: str | None = None
    snapshot_interval_s: float = 0.5
    node_pool_dir: str | None = None
    node_pool_growth: int = 4
    sync_load_max_ms: float = SYNC_LOAD_MAX_S * 1000
    cpu_bytes_to_use: int = 0

    @property
    def state_path(self) -> str:
        d = self.state_dir or os.environ.get("ANCHORAGE_STATE_DIR") or "/tmp/anchorage"
        return os.path.join(d, "host_tier.json")

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> OffloadConfig:
        extra = dict(extra or {})
        cpu = extra.get("cpu_bytes_to_use")
        if isinstance(cpu, bool) or not isinstance(cpu, (int, float)) or not cpu > 0 or (
                isinstance(cpu, float) and not cpu.is_integer()):
            raise HostTierConfigError(
                f"{FIELD}.cpu_bytes_to_use must be an integer > 0 (the host memory for KV "
                f"copies, bytes), got {cpu!r}")
        raw = extra.get("anchorage", {})
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise HostTierConfigError(f"{FIELD}.anchorage must be an object, got {raw!r}")
        names = [f.name for f in fields(cls) if f.name != "cpu_bytes_to_use"]
        unknown = sorted(set(raw) - set(names))
        if unknown:
            raise HostTierConfigError(f"{FIELD}.anchorage: unknown key(s) {', '.join(unknown)}"
                                      f"; known: {', '.join(names)}")
        out: dict[str, Any] = {"cpu_bytes_to_use": int(cpu)}
        for k in ("enabled", "reload_ahead"):
            if k in raw:
                if not isinstance(raw[k], bool):
                    raise HostTierConfigError(f"{FIELD}.anchorage.{k} must be true or false, "
                                              f"got {raw[k]!r}")
                out[k] = raw[k]
        for k in ("transfer_timeout_s", "link_gbs", "snapshot_interval_s"):
            if k not in raw or (k == "transfer_timeout_s" and raw[k] is None):
                continue
            v = raw[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                    math.isfinite(v) and v > 0):
                raise HostTierConfigError(f"{FIELD}.anchorage.{k} must be a number > 0, "
                                          f"got {v!r}")
            out[k] = float(v)
        if "sync_load_max_ms" in raw:
            v = raw["sync_load_max_ms"]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                    math.isfinite(v) and v >= 0):
                raise HostTierConfigError(f"{FIELD}.anchorage.sync_load_max_ms must be a "
                                          f"number >= 0, got {v!r}")
            out["sync_load_max_ms"] = float(v)
        if "node_pool_growth" in raw:
            v = raw["node_pool_growth"]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise HostTierConfigError(f"{FIELD}.anchorage.node_pool_growth must be an "
                                          f"integer >= 1, got {v!r}")
            out["node_pool_growth"] = v
        for k in ("state_dir", "node_pool_dir"):
            if k in raw and raw[k] is not None:
                if not isinstance(raw[k], str) or not raw[k]:
                    raise HostTierConfigError(f"{FIELD}.anchorage.{k} must be a non-empty "
                                              f"string, got {raw[k]!r}")
                out[k] = raw[k]
        return cls(**out)


def anchorage_enabled(cfg: OffloadConfig) -> bool:
    """The configuration's ``enabled`` and the Anchorage plugin on (``ANCHORAGE_POLICY``)."""
    from anchorage.node_agent.config import env_policy

    return cfg.enabled and env_policy() is not None


CONNECTOR = "AnchorageOffloadingConnector"
CONNECTOR_MODULE = "anchorage.node_agent.offload.connector"
SPEC = "AnchorageOffloadingSpec"
SPEC_MODULE = "anchorage.node_agent.offload.spec"
POLICY = "AnchorageCachePolicy"
POLICY_MODULE = "anchorage.node_agent.offload.policy"


def transfer_config(host_bytes: int, *, policy: str = "anchorage", connector: str = "anchorage",
                    spec: str = "anchorage", anchorage: Mapping[str, Any] | None = None,
                    **extra: Any) -> dict[str, Any]:
    """vLLM's ``--kv-transfer-config`` for the host tier (what the chart renders).
    ``policy``: ``anchorage`` (``AnchorageCachePolicy``), ``lru`` or ``arc`` (vLLM's);
    ``connector``: ``anchorage`` or ``stock`` (vLLM's ``OffloadingConnector``); ``spec``:
    ``anchorage`` (the CPU transfer worker where there is no CUDA, vLLM's worker where
    there is) or ``vllm`` (vLLM's ``CPUOffloadingSpec``: CUDA/XPU only); ``anchorage``:
    Anchorage's keys; ``extra``: more ``kv_connector_extra_config`` keys."""
    ec: dict[str, Any] = {"cpu_bytes_to_use": int(host_bytes), **extra}
    if policy == "anchorage":
        ec.update(eviction_policy=POLICY, cache_policy_module_path=POLICY_MODULE)
    elif policy in ("lru", "arc"):
        ec["eviction_policy"] = policy
    else:
        raise ValueError(f"policy must be anchorage, lru or arc, got {policy!r}")
    if spec == "anchorage":
        ec.update(spec_name=SPEC, spec_module_path=SPEC_MODULE)
    elif spec != "vllm":
        raise ValueError(f"spec must be anchorage or vllm, got {spec!r}")
    if anchorage:
        ec["anchorage"] = dict(anchorage)
    out: dict[str, Any] = {"kv_role": "kv_both", "kv_connector_extra_config": ec}
    if connector == "anchorage":
        out.update(kv_connector=CONNECTOR, kv_connector_module_path=CONNECTOR_MODULE,
                   kv_load_failure_policy="recompute")
    elif connector == "stock":
        out["kv_connector"] = "OffloadingConnector"
    else:
        raise ValueError(f"connector must be anchorage or stock, got {connector!r}")
    return out
