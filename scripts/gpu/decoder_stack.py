"""A Llama-shaped decoder stack in plain PyTorch (random bf16 weights, a KV cache), and the
clock that times it: CUDA events (or ``perf_counter`` on CPU), CUDA-graph replay where it
captures, warm-ups, the median of repeats.

One layer: RMSNorm, fused QKV projection, rotary embedding, the new K/V written into the
cache, ``scaled_dot_product_attention`` over the cache (a prefill chunk: GQA through
``enable_gqa``, causal aligned lower-right after cached context, ``causal_lower_right``; a
decode step: the query heads sharing a KV head as the rows of one unmasked attention, as
FlashAttention's own decode path does), output
projection, residual, RMSNorm, fused gate/up projection, SiLU x up, down projection,
residual. The head is the final RMSNorm and the LM head on the tokens that are sampled
(the last of a prefill chunk, every decoding sequence), after the embedding lookup.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F


class Clock:
    """Times a callable: ``warmup`` calls, then ``reps`` timed ones; returns the seconds of
    each timed call (CUDA events on a GPU, wall time on a CPU)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def times(self, fn, warmup: int, reps: int) -> list[float]:
        for _ in range(warmup):
            fn()
        self.sync()
        if not self.cuda:
            out = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
            return out
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
        for start, end in ev:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in ev]

    def measure(self, fn, warmup: int, max_reps: int, target_s: float) -> dict:
        """Median of repeats; the count of repeats fits ``target_s`` (3 at least)."""
        first = self.times(fn, warmup, 1)[0]
        reps = max(3, min(max_reps, int(target_s / max(first, 1e-9))))
        ts = self.times(fn, 0, reps)
        return {"time_s": statistics.median(ts), "reps": reps, "min_s": min(ts),
                "max_s": max(ts)}


def graphed(fn, clock: Clock, enabled: bool):
    """``(replay, how)``: a CUDA graph of ``fn`` where it captures, else ``fn`` itself
    (``how`` says which, and why not)."""
    if not (enabled and clock.cuda):
        return fn, "eager"
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay, "cuda-graph"
    except Exception as exc:  # capture unsupported here: eager timing, recorded
        torch.cuda.synchronize()
        return fn, f"eager (graph capture failed: {type(exc).__name__}: {exc})"[:300]


class Stack:
    """``layers`` decoder layers (and the head) of ``spec``'s shape, random weights."""

    def __init__(self, spec, layers: int, device: torch.device, dtype=torch.bfloat16,
                 seed: int = 0, attn_impl: str = "gqa"):
        self.spec, self.device, self.dtype, self.attn_impl = spec, device, dtype, attn_impl
        self.h, self.k, self.d = spec.heads, spec.kv_heads, spec.head_dim
        gen = torch.Generator(device=device).manual_seed(seed)
        hid, ffn = spec.hidden, spec.ffn_hidden
        qkv = (self.h + 2 * self.k) * self.d

        def w(rows, cols):
            return torch.randn(rows, cols, generator=gen, device=device,
                               dtype=dtype) * rows ** -0.5
        self.layers = [{"n1": torch.ones(hid, device=device, dtype=dtype),
                        "qkv": w(hid, qkv), "o": w(self.h * self.d, hid),
                        "n2": torch.ones(hid, device=device, dtype=dtype),
                        "gu": w(hid, 2 * ffn), "down": w(ffn, hid)}
                       for _ in range(layers)]
        self.embed = w(spec.vocab, hid)
        self.norm = torch.ones(hid, device=device, dtype=dtype)
        self.lm_head = w(hid, spec.vocab)
        inv = 1.0 / (500000.0 ** (torch.arange(0, self.d, 2, device=device).float() / self.d))
        self.inv_freq = inv

    def weight_bytes(self) -> int:
        ts = [t for layer in self.layers for t in layer.values()]
        return sum(t.numel() * t.element_size() for t in ts + [self.embed, self.lm_head])

    def kv_cache(self, batch: int, tokens: int, layers: int | None = None, fill: bool = True):
        """Per layer (the first ``layers``, default all) (K, V), each ``(batch, kv_heads,
        tokens, head_dim)``, random."""
        out = []
        for _ in self.layers[:layers]:
            kv = torch.empty(2, batch, self.k, tokens, self.d, device=self.device,
                             dtype=self.dtype)
            if fill:
                kv.normal_()
            out.append((kv[0], kv[1]))
        return out

    def rope_tables(self, start: int, length: int):
        pos = torch.arange(start, start + length, device=self.device).float()
        ang = torch.outer(pos, self.inv_freq)
        ang = torch.cat((ang, ang), -1)
        return ang.cos().to(self.dtype)[None, :, None], ang.sin().to(self.dtype)[None, :, None]

    def _attend(self, q, keys, vals, s: int, start: int):
        b = q.shape[0]
        if s == 1:  # decode: each KV head's query heads as rows, exact without a mask
            g = self.h // self.k
            o = F.scaled_dot_product_attention(q.reshape(b, self.k, g, self.d), keys, vals)
            return o.reshape(b, self.h, 1, self.d)
        gqa = self.k != self.h
        if gqa and self.attn_impl == "expand":
            rep = self.h // self.k
            keys, vals, gqa = keys.repeat_interleave(rep, 1), vals.repeat_interleave(rep, 1), False
        if start == 0:
            return F.scaled_dot_product_attention(q, keys, vals, is_causal=True,
                                                  enable_gqa=gqa)
        from torch.nn.attention.bias import causal_lower_right

        return F.scaled_dot_product_attention(q, keys, vals,
                                              attn_mask=causal_lower_right(s, start + s),
                                              enable_gqa=gqa)

    def layer(self, x, w, cache, start: int, rope):
        kc, vc = cache
        b = kc.shape[0]
        t = x.shape[0]
        s = t // b
        h, k, d = self.h, self.k, self.d
        y = F.rms_norm(x, (x.shape[-1],), w["n1"], 1e-5)
        q, kk, v = (y @ w["qkv"]).split([h * d, k * d, k * d], -1)
        cos, sin = rope
        q = _rotate(q.view(b, s, h, d), cos, sin)
        kk = _rotate(kk.view(b, s, k, d), cos, sin)
        kc[:, :, start:start + s] = kk.transpose(1, 2)
        vc[:, :, start:start + s] = v.view(b, s, k, d).transpose(1, 2)
        o = self._attend(q.transpose(1, 2), kc[:, :, :start + s], vc[:, :, :start + s], s,
                         start)
        x = x + o.transpose(1, 2).reshape(t, h * d) @ w["o"]
        y = F.rms_norm(x, (x.shape[-1],), w["n2"], 1e-5)
        gate, up = (y @ w["gu"]).chunk(2, -1)
        return x + (F.silu(gate) * up) @ w["down"]

    def layers_fn(self, batch: int, new: int, start: int, caches):
        """A callable running the first ``len(caches)`` layers on ``batch x new`` tokens
        after ``start`` cached."""
        x = torch.randn(batch * new, self.spec.hidden, device=self.device, dtype=self.dtype)
        rope = self.rope_tables(start, new)

        def run():
            y = x
            for w, cache in zip(self.layers, caches):
                y = self.layer(y, w, cache, start, rope)
            return y
        return run

    def head_fn(self, tokens: int, sampled: int):
        """A callable: embedding lookup of ``tokens`` ids, the final norm and LM head on
        ``sampled`` of them."""
        ids = torch.randint(0, self.spec.vocab, (tokens,), device=self.device)

        def run():
            e = F.embedding(ids, self.embed)
            y = F.rms_norm(e[-sampled:], (e.shape[-1],), self.norm, 1e-5)
            return y @ self.lm_head
        return run


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def probe_attention(spec, device: torch.device, dtype=torch.bfloat16) -> dict:
    """Which way a prefill chunk's attention over cached context runs here: lower-right
    causal with GQA through the flash kernel (``gqa``), with the KV heads expanded
    (``expand``: the copies are timed too), or neither (``none``: cached-context prefill
    points are skipped, the fallback would materialise an n x (c + n) mask)."""
    if device.type != "cuda":
        return {"impl": "gqa", "note": "cpu: SDPA's CPU kernels (lower-right mask materialised)"}
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    q = torch.randn(1, spec.heads, 256, spec.head_dim, device=device, dtype=dtype)
    kv = torch.randn(1, spec.kv_heads, 1280, spec.head_dim, device=device, dtype=dtype)
    errors = []
    for impl in ("gqa", "expand"):
        k = kv if impl == "gqa" else kv.repeat_interleave(spec.heads // spec.kv_heads, 1)
        try:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                F.scaled_dot_product_attention(q, k, k, attn_mask=causal_lower_right(256, 1280),
                                               enable_gqa=impl == "gqa")
            torch.cuda.synchronize()
            return {"impl": impl, "note": "flash attention (torch SDPA), lower-right causal"
                    + ("" if impl == "gqa" else "; KV heads expanded (repeat_interleave)")}
        except Exception as exc:
            errors.append(f"{impl}: {type(exc).__name__}: {str(exc)[:200]}")
    return {"impl": "none", "note": "; ".join(errors)}
