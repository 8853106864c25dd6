"""Request keys for routing: chained block keys, tenant salts and agent identity.

- ``chain_keys(chunks, salt)``: key_i = H(key_{i-1}, chunk_i), key_{-1} = H(salt): a key
  stands for the whole prefix up to its block, as in vLLM's prefix cache, and two tenants
  never share a key (the salt is the tenant's ``cache_salt``).
- ``token_block_keys(ids, block_size, salt)``: full blocks of token ids only (vLLM caches
  full blocks only). ``text_block_keys(text, chars_per_block, salt)``: the same over
  characters, for text prompts the router does not tokenize (an approximation of token
  blocks, SGLang's router matches on characters the same way).
- ``tenant_salt(tenant, secret)``: the per-tenant ``cache_salt`` sent to vLLM; a keyed hash,
  so the salt reveals nothing about the tenant id or API key.
- ``agent_id(ctx, anchor_blocks)``: an agent's identity: the client's hint
  (``vllm_xargs.anchorage.agent``), scoped by tenant, else a fingerprint of the request's
  leading ``anchor_blocks`` keys (the anchor: system prompt, tools). Local stand-in for
  ``anchorage.fingerprint``, to be unified with it.

Hashes are blake2b-64: stable across processes (Python's ``hash`` of str is not).
"""

from __future__ import annotations

import hashlib
from typing import Hashable, Iterable, Sequence

from anchorage.policies.base import RequestContext


def stable_hash(data: bytes | str) -> int:
    if isinstance(data, str):
        data = data.encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def tenant_salt(tenant: str | None, secret: str = "") -> str | None:
    if tenant is None:
        return None
    return hashlib.blake2b(tenant.encode(), key=secret.encode()[:64],
                           digest_size=16).hexdigest()


def root_key(salt: str | None = None) -> int:
    return stable_hash(b"anchorage-root:" + (salt or "").encode())


def next_key(prev: int, chunk: bytes) -> int:
    return stable_hash(prev.to_bytes(8, "little") + chunk)


def token_chunk(token_ids: Sequence[int]) -> bytes:
    return ",".join(map(str, token_ids)).encode()


def chain_keys(chunks: Iterable[bytes], salt: str | None = None) -> list[int]:
    prev = root_key(salt)
    out = []
    for c in chunks:
        prev = next_key(prev, c)
        out.append(prev)
    return out


def token_block_keys(token_ids: Sequence[int], block_size: int,
                     salt: str | None = None) -> list[int]:
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    n = len(token_ids) // block_size
    return chain_keys((token_chunk(token_ids[i * block_size:(i + 1) * block_size])
                       for i in range(n)), salt)


def text_block_keys(text: str, chars_per_block: int = 256, salt: str | None = None) -> list[int]:
    data = text.encode()
    n = len(data) // chars_per_block
    return chain_keys((data[i * chars_per_block:(i + 1) * chars_per_block] for i in range(n)), salt)


def agent_id(ctx: RequestContext, anchor_blocks: int = 4) -> Hashable:
    if ctx.agent_hint:
        return ("hint", ctx.tenant, ctx.agent_hint)
    keys = ctx.keys
    if not keys:
        return ("empty", ctx.tenant)
    # Chained keys: the key of the last anchor block identifies the whole anchor.
    return ("fp", keys[min(len(keys), anchor_blocks) - 1])
