"""Eviction policies: one module each, opening with its specification."""

from anchorage.policies.base import EvictionPolicy, RequestContext
from anchorage.policies.registry import make_policy, policy_names

__all__ = ["EvictionPolicy", "RequestContext", "make_policy", "policy_names"]
