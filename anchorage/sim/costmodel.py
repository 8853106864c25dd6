"""Step-time cost model of a transformer engine step (prefill chunks + decodes), roofline.

Specification
-------------
One engine step runs every scheduled request's new tokens through the model at once
(continuous batching with chunked prefill). Inputs: prefill chunks ``(n, c)`` (``n`` new
tokens after ``c`` tokens of context already in the KV cache) and decodes (one new token
each after ``c`` tokens of context). With ``P`` parameters, ``l`` layers, hidden size
``d``, KV bytes per token ``kv`` and ``T`` new tokens in the step:

- FLOPs  ``F = 2 P T`` (weight GEMMs) ``+ 4 l d sum_prefill n (c + (n + 1) / 2)``
  ``+ 4 l d sum_decode (c + 1)`` (attention: ``QK^T`` and ``AV``, causal within a chunk);
- bytes  ``B = bytes(P)`` (weights, read once per step) ``+ kv (sum_prefill (c + n) +
  sum_decode (c + 1))`` (KV read by attention) ``+ kv T`` (KV written);
- time   ``t = max(F / (g peak mfu), B / (g bw mbu)) + overhead + comm`` over ``g``
  tensor-parallel devices, where ``comm = 2 l (latency + 2 (g-1)/g T d bytes / link_bw)``
  (two ring all-reduces of the activations per layer), 0 for ``g = 1``. A profile with
  ``attn_mfu`` set (a measured one, ``anchorage.sim.calibration``) splits the compute term:
  ``F_gemm / (g peak mfu) + F_attn / (g peak attn_mfu)`` (``F_gemm = 2 P T``, ``F_attn`` the
  attention FLOPs above); without it both run at ``mfu``.

Prefill is compute-bound (``F`` dominates for chunks of hundreds of tokens), decode is
bandwidth-bound (weights plus the KV of every running sequence): the regime change is
what makes prefix-cache hits matter for TTFT and batch size matter for throughput.
"""

from __future__ import annotations

from typing import Iterable

from anchorage.sim.profiles import HardwareProfile


def step_time_s(profile: HardwareProfile, prefill: Iterable[tuple[int, int]],
                decode_contexts: Iterable[int] = ()) -> float:
    """Seconds one engine step takes. ``prefill``: (new tokens, context before) per chunk;
    ``decode_contexts``: context length before the new token, per decoding request."""
    m = profile.model
    ld4 = 4.0 * m.layers * m.hidden
    tokens = 0
    attn_flops = 0.0
    kv_tokens_read = 0
    for n, c in prefill:
        tokens += n
        attn_flops += ld4 * n * (c + (n + 1) / 2.0)
        kv_tokens_read += c + n
    n_dec = 0
    ctx_dec = 0
    for c in decode_contexts:
        n_dec += 1
        ctx_dec += c + 1
    tokens += n_dec
    attn_flops += ld4 * ctx_dec
    kv_tokens_read += ctx_dec
    if tokens == 0:
        return 0.0
    return _step_s(profile, tokens, attn_flops, kv_tokens_read)


def _step_s(profile: HardwareProfile, tokens: int, attn_flops: float,
            kv_tokens_read: int) -> float:
    """The roofline of a step of ``tokens`` new tokens (the module's ``t``)."""
    m = profile.model
    nbytes = m.weight_bytes + m.kv_bytes_per_token * (kv_tokens_read + tokens)
    g = profile.devices
    t_compute = compute_time_s(profile, 2.0 * m.params * tokens, attn_flops)
    t_memory = nbytes / (g * profile.mem_bw_bytes_s * profile.mbu)
    t = max(t_compute, t_memory) + profile.step_overhead_s
    if g > 1 and profile.link_bw_bytes_s > 0:
        act = tokens * m.hidden * m.dtype_bytes
        t += 2 * m.layers * (profile.link_latency_s
                             + 2.0 * (g - 1) / g * act / profile.link_bw_bytes_s)
    return t


def compute_time_s(profile: HardwareProfile, gemm_flops: float, attn_flops: float) -> float:
    """The compute term: weight-GEMM and attention FLOPs over the devices' effective rate
    (attention at ``attn_mfu`` when the profile has one, else at ``mfu``)."""
    rate = profile.devices * profile.peak_flops
    if profile.attn_mfu is None:
        return (gemm_flops + attn_flops) / (rate * profile.mfu)
    return gemm_flops / (rate * profile.mfu) + attn_flops / (rate * profile.attn_mfu)


def prefill_flops(model, n_tokens: int, context_tokens: int) -> tuple[float, float]:
    """(weight-GEMM, attention) FLOPs of ``n`` new tokens after ``c`` cached:
    ``2 P n`` and ``4 l d n (c + (n + 1) / 2)``."""
    return (2.0 * model.params * n_tokens,
            4.0 * model.layers * model.hidden * n_tokens
            * (context_tokens + (n_tokens + 1) / 2.0))


def decode_step_s(profile: HardwareProfile, n: int, context_sum: int) -> float:
    """``step_time_s(profile, [], contexts)`` for ``n`` decodes whose contexts sum to
    ``context_sum``, in O(1) (the same arithmetic: a decode span's steps,
    ``anchorage.sim.span``)."""
    if n <= 0:
        return 0.0
    m = profile.model
    ctx_dec = context_sum + n
    return _step_s(profile, n, 0.0 + 4.0 * m.layers * m.hidden * ctx_dec, ctx_dec)


def decode_span_ends(profile: HardwareProfile, n: int, context_sum: int, k: int,
                     start_s: float, horizon_s: float = float("inf")) -> list[float]:
    """End times of ``k`` consecutive decode steps of ``n`` requests (contexts summing to
    ``context_sum`` before the first, each one token longer per step) started at
    ``start_s``, stopping after the first end at or after ``horizon_s``. Each step is
    ``decode_step_s`` written as ``max(a + b j, c + d j) + e`` (linear in the step
    index ``j``): equal to it up to rounding."""
    m = profile.model
    g = profile.devices
    rate = g * profile.peak_flops
    ld4 = 4.0 * m.layers * m.hidden
    gemm = 2.0 * m.params * n
    # compute term: (gemm + attn) / (rate mfu), or gemm / (rate mfu) + attn / (rate attn_mfu)
    amfu = profile.mfu if profile.attn_mfu is None else profile.attn_mfu
    a = gemm / (rate * profile.mfu) + ld4 * (context_sum + n) / (rate * amfu)
    b = ld4 * n / (rate * amfu)
    bw = g * profile.mem_bw_bytes_s * profile.mbu
    c = (m.weight_bytes + m.kv_bytes_per_token * (context_sum + 2 * n)) / bw
    d = m.kv_bytes_per_token * n / bw
    e = profile.step_overhead_s
    if g > 1 and profile.link_bw_bytes_s > 0:
        e += 2 * m.layers * (profile.link_latency_s + 2.0 * (g - 1) / g
                             * n * m.hidden * m.dtype_bytes / profile.link_bw_bytes_s)
    ends = []
    t = start_s
    for j in range(k):
        x, y = a + b * j, c + d * j
        t += (x if x > y else y) + e
        ends.append(t)
        if t >= horizon_s:
            break
    return ends
