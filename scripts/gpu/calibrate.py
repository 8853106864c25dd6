"""Measure a hardware profile on one GPU with plain PyTorch and fit its cost-model
coefficients: one command, no arguments needed, one JSON out.

What it times (``scripts/gpu/README.md``; method notes are written into the JSON):

- prefill: a decoder stack of the profile's model shape (``decoder_stack.py``; random bf16 weights),
  new-token counts 256..32k over cached contexts 0..128k, ``--prefill-layers`` layers timed
  and scaled to the model's depth (full-model time = stack x layers / timed + head),
  checked against the full depth at a few points (``depth_check``);
- decode: one step at batch sizes 1..256 and contexts 1k..128k, the full depth; shapes
  whose KV exceeds the profile's KV capacity, or the free GPU memory, are skipped with
  the reason recorded;
- host link: pinned host <-> device copies (``host_link.py``);

then fits ``anchorage.sim.calibration`` (mfu, attn_mfu, mbu, GPU step overhead; host link
bandwidth and latency) and reports model vs measurement per point. A time budget
(``--budget-s``, default 450 s) bounds the run: points are taken cheapest first and those
that would run past their phase's share are skipped (recorded). The JSON is rewritten
after every phase, so a run cut short still leaves its measurements.

Usage::

    python scripts/gpu/calibrate.py [--out FILE] [--profile h200-llama3-8b]
    python scripts/gpu/calibrate.py --estimate     # the grid's estimated runtime, no torch
    python scripts/gpu/calibrate.py --tiny --device cpu --out /tmp/cal.json   # seconds

``--out`` defaults to ``$OUT/<profile>-calibration.json`` when ``OUT`` is set, else the
current directory. Load the result with ``anchorage sim --mode timed --calibration FILE``
(or ``--profile FILE``, ``HardwareProfile.from_calibration``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root: anchorage, stdlib-only here

from anchorage.sim import calibration as cal  # noqa: E402
from anchorage.sim.costmodel import step_time_s  # noqa: E402
from anchorage.sim.profiles import get_profile  # noqa: E402

GRIDS = {
    "full": dict(prefill_new=(256, 512, 1024, 2048, 4096, 8192, 16384, 32768),
                 prefill_ctx=(0, 1024, 4096, 16384, 32768, 65536, 131072),
                 decode_batch=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                 decode_ctx=(1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072),
                 link_single=(2 ** 15, 2 ** 21, 2 ** 25, 2 ** 28, 2 ** 30),
                 link_blocks=(16, 64, 256), link_pieces=(256, 1024, 4096),
                 prefill_layers=4, depth_check=((4096, 0), (8192, 32768), (2048, 131072)),
                 reps=10, target_s=0.25, budget_s=450.0),
    "tiny": dict(prefill_new=(16, 128), prefill_ctx=(0, 512),
                 decode_batch=(1, 8, 32), decode_ctx=(64, 512),
                 link_single=(2 ** 12, 2 ** 18), link_blocks=(4, 16),
                 link_pieces=(16,), prefill_layers=1, depth_check=((128, 512),),
                 reps=3, target_s=0.005, budget_s=60.0),
}
# shares of the budget, cumulative: what a phase did not use goes to the next
# (the link runs last: a copy that fails its graph capture is the likeliest to upset CUDA)
PHASE_END = {"decode": 0.2, "prefill": 0.75, "depth_check": 0.85, "link": 0.97}
RUNS_PER_POINT = 4  # two graph warm-ups, one sizing run, one warm-up, besides the repeats


def log(msg: str) -> None:
    print(msg, flush=True)


def decode_points(profile, grid) -> tuple[list[tuple[int, int]], list[dict]]:
    """(batch, context) to run, and the skipped ones with their reason."""
    cap = profile.capacity_blocks * profile.block_size
    run, skipped = [], []
    for b in grid["decode_batch"]:
        for c in grid["decode_ctx"]:
            if b * (c + 1) > cap:
                skipped.append({"batch": b, "context_tokens": c, "reason":
                                f"{b} x {c + 1} tokens exceed {profile.name}'s KV capacity "
                                f"({cap} tokens): no engine step has this shape"})
            else:
                run.append((b, c))
    return run, skipped


def point_estimate_s(profile, grid, kind: str, a: int, c: int, layers: int) -> float:
    """Wall seconds one point takes by the (derived) profile: its runs times their time."""
    m = profile.model
    if kind == "prefill":
        t = step_time_s(profile, [(a, c)]) * layers / m.layers
    else:
        t = step_time_s(profile, [], [c] * a) * layers / m.layers
    reps = max(3, min(grid["reps"], int(grid["target_s"] / max(t, 1e-9))))
    return t * (RUNS_PER_POINT + reps) + 0.1  # + allocation, KV fill, capture, head


def estimate(profile, grid) -> dict:
    """Estimated seconds per phase, from the profile's cost model (a GPU run replaces it)."""
    L = grid["prefill_layers"]
    pre = sum(point_estimate_s(profile, grid, "prefill", n, c, L)
              for n in grid["prefill_new"] for c in grid["prefill_ctx"])
    dec = sum(point_estimate_s(profile, grid, "decode", b, c, profile.model.layers)
              for b, c in decode_points(profile, grid)[0])
    depth = sum(point_estimate_s(profile, grid, "prefill", n, c, profile.model.layers + L)
                for n, c in grid["depth_check"])
    bb = profile.kv_bytes_per_block
    link_bytes = 2 * 8 * (sum(grid["link_single"]) + bb * sum(grid["link_blocks"]))
    link = link_bytes / 25e9 + 0.5  # ~25 GB/s, about 8 runs of each copy set, each way
    return {"prefill_s": pre, "decode_s": dec, "depth_check_s": depth, "link_s": link,
            "startup_s": 30.0, "total_s": pre + dec + depth + link + 30.0}


def device_info(torch, device) -> dict:
    info = {"type": device.type, "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version()}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(name=p.name, capability=list(torch.cuda.get_device_capability(device)),
                    memory_bytes=p.total_memory, multiprocessors=p.multi_processor_count,
                    cudnn=torch.backends.cudnn.version())
    else:
        info.update(name=platform.processor() or platform.machine(),
                    threads=torch.get_num_threads())
    return info


def _time_point(ctx, batch: int, new: int, start: int, layers: int) -> dict:
    """One step shape: the first ``layers`` layers (graph-replayed where it captures) and
    the head on the sampled tokens (the last of a chunk, every decoding sequence)."""
    stack, clock, grid = ctx["stack"], ctx["clock"], ctx["grid"]
    caches = run = head = None
    try:
        caches = stack.kv_cache(batch, start + new, layers)
        run, issue = ctx["graphed"](stack.layers_fn(batch, new, start, caches))
        body = clock.measure(run, 1, grid["reps"], grid["target_s"])
        head, _ = ctx["graphed"](stack.head_fn(batch * new, batch))
        head_m = clock.measure(head, 1, grid["reps"], grid["target_s"])
    finally:
        caches = run = head = None
        ctx["free"]()
    total = body["time_s"] * ctx["profile"].model.layers / layers + head_m["time_s"]
    return {"time_s": total, "stack_s": body["time_s"], "head_s": head_m["time_s"],
            "layers_timed": layers, "reps": body["reps"], "stack_min_s": body["min_s"],
            "stack_max_s": body["max_s"], "issue": issue}


def measure_steps(ctx, phase: str, points, layers: int) -> list[dict]:
    """Each point of ``points`` ((n, c) for prefill, (batch, c) for decode), cheapest
    first, while the phase's time lasts (the estimates scaled by how much longer than its
    estimate the last point took); skipped ones recorded with their reason."""
    torch, doc, prof = ctx["torch"], ctx["doc"], ctx["profile"]
    kind = "decode" if phase == "decode" else "prefill"
    keys = ("batch", "context_tokens") if kind == "decode" else ("new_tokens", "context_tokens")
    est = {p: point_estimate_s(prof, ctx["grid"], kind, *p, layers) for p in points}
    out = []
    scale = 1.0
    for a, c in sorted(points, key=est.get):
        tokens = a * (c + 1) if kind == "decode" else c + a
        need = prof.model.kv_bytes_per_token * tokens * layers / prof.model.layers + 2 ** 31
        free = ctx["free_bytes"]()
        guess = est[(a, c)] * scale
        reason = None
        if kind == "prefill" and c > 0 and ctx["attn"]["impl"] == "none":
            reason = "no flash kernel for lower-right causal attention: " + ctx["attn"]["note"]
        elif free is not None and need > free:
            reason = f"needs {need / 2 ** 30:.1f} GiB (KV, activations), {free / 2 ** 30:.1f} free"
        elif time.monotonic() + guess > ctx["deadline"]:
            reason = f"time budget (estimated {guess:.1f} s)"
        if reason is None:
            t0 = time.monotonic()
            try:
                m = _time_point(ctx, *((a, 1, c) if kind == "decode" else (1, a, c)), layers)
            except torch.cuda.OutOfMemoryError as exc:
                reason = f"out of memory: {str(exc)[:160]}"
            scale = max(1.0, (time.monotonic() - t0) / est[(a, c)])
        if reason:
            doc["skipped"].append({"phase": phase, keys[0]: a, keys[1]: c, "reason": reason})
            continue
        out.append({keys[0]: a, keys[1]: c, **m})
        log(f"{phase:<11} {keys[0][:5]}={a:>6} c={c:>7} ({layers} layers): "
            f"{m['time_s'] * 1e3:10.3f} ms  stack {m['stack_s'] * 1e3:.3f} ms  "
            f"head {m['head_s'] * 1e3:.3f} ms  {m['issue'][:24]}")
    return out


METHOD = {
    "prefill": "one sequence: n new tokens after c cached; the first {L} of {layers} layers "
               "timed and scaled by {layers}/{L}, plus the head (embedding lookup, final norm, "
               "LM head on the last token); see depth_check",
    "decode": "one step of b sequences of c cached tokens each, all {layers} layers, LM head "
              "on every sequence; no sampling kernel",
    "attention": "torch scaled_dot_product_attention over a contiguous KV cache (vLLM pages "
                 "it); prefill: GQA through enable_gqa, cached-context chunks causal "
                 "lower-right; decode: a KV head's query heads as the rows of one unmasked "
                 "attention; "
                 "torch's flash kernel is FlashAttention-2 (vLLM runs FA3 on Hopper: its "
                 "long-context prefill may be faster)",
    "timing": "CUDA graph replay where it captures (vLLM replays graphs), CUDA events, "
              "median of repeats after warm-ups; unfused elementwise kernels (RMSNorm, "
              "rotary, SiLU) where vLLM fuses some",
    "link": "pinned host memory; single copies, {bb}-byte block copies (the profile's block "
            "size, all layers packed) and {pb}-byte per-layer K or V pieces; each direction "
            "alone, then both at once on two streams",
    "fit": "anchorage.sim.calibration: weighted least squares on relative errors, regimes "
           "(compute / memory) re-assigned until stable; efficiencies are effective ones "
           "against the cost model's FLOP and byte counts (datasheet peak and bandwidth kept)",
}


def write(doc: dict, out: Path) -> None:
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=None,
                    help="profile whose model is built (default h200-llama3-8b; cpu-tiny "
                         "with --tiny)")
    ap.add_argument("--tiny", action="store_true", help="tiny grid (CPU tests: seconds)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    ap.add_argument("--out", default=None, help="JSON path (default $OUT/ or ./<profile>-"
                                                "calibration.json)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="wall-time budget (default 450; 60 with --tiny)")
    ap.add_argument("--prefill-layers", type=int, default=None,
                    help="layers timed in prefill, scaled to the model's (default 4)")
    ap.add_argument("--no-graphs", action="store_true", help="time eager, no CUDA graphs")
    ap.add_argument("--estimate", action="store_true",
                    help="print the grid's estimated runtime (from the profile) and exit")
    args = ap.parse_args(argv)
    args.profile = args.profile or ("cpu-tiny" if args.tiny else "h200-llama3-8b")
    return args


def main(argv=None) -> int:
    t0 = time.monotonic()
    args = parse_args(argv)
    base = get_profile(args.profile)
    grid = dict(GRIDS["tiny" if args.tiny else "full"])
    if args.budget_s is not None:
        grid["budget_s"] = args.budget_s
    if args.prefill_layers is not None:
        grid["prefill_layers"] = args.prefill_layers
    m = base.model
    grid["prefill_layers"] = max(1, min(grid["prefill_layers"], m.layers))
    if args.estimate:
        print(json.dumps({"profile": base.name, "estimate": estimate(base, grid)}, indent=1))
        return 0
    if not (m.ffn_hidden > 0 and m.vocab > 0):
        print(f"{base.name}'s model states no ffn_hidden/vocab: cannot build it", file=sys.stderr)
        return 2
    import torch

    sys.path.insert(0, str(HERE))
    import decoder_stack as stack_mod
    from host_link import measure_link

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out = Path(args.out or Path(os.environ.get("OUT") or ".") / f"{base.name}-calibration.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    clock = stack_mod.Clock(device)
    L, budget = grid["prefill_layers"], grid["budget_s"]
    bb = base.kv_bytes_per_block
    pb = bb // (2 * m.layers)
    doc = {"format": cal.FORMAT, "complete": False, "profile": base.name,
           "model": {"name": m.name, "params": m.params, "layers": m.layers,
                     "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
                     "head_dim": m.head_dim, "ffn_hidden": m.ffn_hidden, "vocab": m.vocab,
                     "dtype": "bfloat16", "block_size": base.block_size},
           "device": device_info(torch, device),
           "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
               timespec="seconds"),
           "settings": {**{k: v for k, v in grid.items()}, "graphs": not args.no_graphs,
                        "tiny": args.tiny},
           "estimate": estimate(base, grid),
           "method": {k: v.format(L=L, layers=m.layers, bb=bb, pb=pb) for k, v in METHOD.items()},
           "measurements": {"prefill": [], "decode": [], "link": None, "depth_check": []},
           "skipped": [], "phase_errors": {}, "phase_s": {}}
    log(f"calibrating {base.name} on {doc['device'].get('name')} ({device}), torch "
        f"{torch.__version__}; estimated {doc['estimate']['total_s']:.0f} s, budget {budget:.0f} s")
    torch.manual_seed(0)
    stk = stack_mod.Stack(m, m.layers, device)
    ctx = {"torch": torch, "stack": stk, "clock": clock, "grid": grid, "doc": doc,
           "profile": base, "attn": stack_mod.probe_attention(m, device),
           "graphed": lambda fn: stack_mod.graphed(fn, clock, not args.no_graphs)}
    if device.type == "cuda":
        ctx["free"] = torch.cuda.empty_cache
        ctx["free_bytes"] = lambda: torch.cuda.mem_get_info(device)[0]
    else:
        ctx["free"], ctx["free_bytes"] = (lambda: None), (lambda: None)
    doc["method"]["attention_kernel"] = ctx["attn"]["note"]
    doc["measurements"]["weight_bytes_on_device"] = stk.weight_bytes()
    dec_pts, dec_skipped = decode_points(base, grid)
    doc["skipped"] += [{"phase": "decode", **s} for s in dec_skipped]
    pre_pts = [(n, c) for n in grid["prefill_new"] for c in grid["prefill_ctx"]]
    meas = doc["measurements"]
    phases = [
        ("decode", lambda: meas.__setitem__("decode", measure_steps(ctx, "decode", dec_pts,
                                                                    m.layers))),
        ("prefill", lambda: meas.__setitem__("prefill", measure_steps(ctx, "prefill", pre_pts, L))),
        ("depth_check", lambda: meas.__setitem__("depth_check", depth_check(ctx, grid, L))),
        ("link", lambda: meas.__setitem__("link", measure_link(
            clock, device, {"single": grid["link_single"], "blocks": grid["link_blocks"],
                            "pieces": grid["link_pieces"], "block_bytes": bb, "piece_bytes": pb},
            not args.no_graphs, grid["reps"], grid["target_s"], ctx["deadline"], log))),
    ]
    for name, run in phases:
        ts = time.monotonic()
        ctx["deadline"] = t0 + PHASE_END[name] * budget
        try:
            run()
        except Exception as exc:  # a phase that breaks is recorded; the others still run
            doc["phase_errors"][name] = f"{type(exc).__name__}: {exc}"[:500]
            log(f"phase {name} failed:\n{traceback.format_exc()}")
            ctx["free"]()
        doc["phase_s"][name] = time.monotonic() - ts
        write(doc, out)
    try:
        cal.fit_document(doc, base)
    except (ValueError, ZeroDivisionError) as exc:
        doc["phase_errors"]["fit"] = f"{type(exc).__name__}: {exc}"
    doc["elapsed_s"] = time.monotonic() - t0
    doc["complete"] = True
    write(doc, out)
    report(doc, out)
    return 0


def depth_check(ctx, grid, L: int) -> list[dict]:
    """The scaled reduced stack against the full depth, at a few prefill points."""
    layers = ctx["profile"].model.layers
    if L >= layers:
        return []
    pts = list(grid["depth_check"])
    scaled = {(r["new_tokens"], r["context_tokens"]): r
              for r in measure_steps(ctx, "depth_check", pts, L)}
    rows = []
    for r in measure_steps(ctx, "depth_check", [p for p in pts if p in scaled], layers):
        key = (r["new_tokens"], r["context_tokens"])
        s = scaled[key]["time_s"]
        rows.append({"new_tokens": key[0], "context_tokens": key[1], "layers_timed": L,
                     "scaled_s": s, "full_depth_s": r["time_s"],
                     "error_pct": 100 * (s - r["time_s"]) / r["time_s"]})
    return rows


def report(doc: dict, out: Path) -> None:
    f = doc.get("fit")
    if f:
        log(f"fit: mfu {f['mfu']:.3f}, attn_mfu {f['attn_mfu']:.3f}, mbu {f['mbu']:.3f}, GPU "
            f"step overhead {f['gpu_step_overhead_s'] * 1e3:.3f} ms"
            + "".join(f"; {w}" for w in f["warnings"]))
        for pattern, dirs in f["link"].items():
            log(f"link {pattern}: " + ", ".join(
                f"{d} {v['bytes_s'] / 1e9:.2f} GB/s + {v['latency_s'] * 1e6:.1f} us"
                for d, v in dirs.items()))
        for kind, s in doc["errors"]["summary"].items():
            if s["points"]:
                log(f"model vs measured, {kind}: {s['points']} points, median |error| "
                    f"{s['median_abs_pct']:.1f} %, max {s['max_abs_pct']:.1f} %")
    for r in doc["measurements"]["depth_check"]:
        log(f"depth check n={r['new_tokens']} c={r['context_tokens']}: scaled from "
            f"{r['layers_timed']} layers {r['error_pct']:+.1f} % vs full depth")
    log(f"{len(doc['skipped'])} points skipped; errors: {doc['phase_errors'] or 'none'}; "
        f"{doc['elapsed_s']:.1f} s; wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
