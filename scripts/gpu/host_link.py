"""Host <-> device copies as a KV offload makes them: pinned host memory, each direction
alone and both at once (two streams).

Patterns (``pattern`` in each point): ``single`` (one copy of ``bytes``), ``blocks``
(``copies`` back-to-back copies of one KV block of the profile's block size, all layers
packed: what the simulator's host tier moves), ``pieces`` (copies of one layer's K or V of
one block: vLLM's per-layer paged layout copied block by block). Block and piece copies are
captured into a CUDA graph where that works (no Python time between copies), else issued
one by one; ``issue`` records which. On a CPU device both buffers are host memory
(unpinned): the code path runs, the numbers mean nothing.
"""

from __future__ import annotations

import time
from itertools import zip_longest

import torch

from decoder_stack import graphed


def _pairs(dst, src, nbytes: int, count: int):
    return [(dst[i * nbytes:(i + 1) * nbytes], src[i * nbytes:(i + 1) * nbytes])
            for i in range(count)]


def _copies(pairs):
    def run():
        for d, s in pairs:
            d.copy_(s, non_blocking=True)
    return run


class HostLink:
    def __init__(self, clock, device: torch.device, max_bytes: int):
        self.clock, self.device = clock, device
        self.pinned = device.type == "cuda"
        kw = {"dtype": torch.uint8}
        self.host_dst = torch.empty(max_bytes, pin_memory=self.pinned, **kw)
        self.host_src = torch.empty(max_bytes, pin_memory=self.pinned, **kw).fill_(1)
        self.dev_src = torch.ones(max_bytes, device=device, **kw)
        self.dev_dst = torch.empty(max_bytes, device=device, **kw)
        self.graph_failed = False  # after one failed capture, the rest is issued eagerly

    def pairs(self, direction: str, nbytes: int, count: int):
        if direction == "d2h":
            return _pairs(self.host_dst, self.dev_src, nbytes, count)
        return _pairs(self.dev_dst, self.host_src, nbytes, count)

    def measure(self, direction: str, pattern: str, nbytes: int, count: int,
                graphs: bool, reps: int, target_s: float) -> dict:
        fn, issue = _copies(self.pairs(direction, nbytes, count)), "eager"
        if count > 1 and graphs:
            fn, issue = graphed(fn, self.clock, graphs)
            self.graph_failed = self.graph_failed or issue != "cuda-graph"
        m = self.clock.measure(fn, 1, reps, target_s)
        return {"direction": direction, "pattern": pattern, "bytes": nbytes, "copies": count,
                **m, "gb_s": nbytes * count / m["time_s"] / 1e9, "issue": issue}

    def duplex(self, pattern: str, nbytes: int, count: int, reps: int) -> dict:
        """Both directions at once, each on its own stream, copies interleaved; the median
        over ``reps`` of each stream's own time."""
        d2h, h2d = self.pairs("d2h", nbytes, count), self.pairs("h2d", nbytes, count)
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        runs = []
        for _ in range(reps + 1):
            cur = torch.cuda.current_stream()
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            s1.wait_stream(cur)
            s2.wait_stream(cur)
            ev[0].record(s1)
            ev[2].record(s2)
            for a, b in zip_longest(d2h, h2d):
                if a is not None:
                    with torch.cuda.stream(s1):
                        a[0].copy_(a[1], non_blocking=True)
                if b is not None:
                    with torch.cuda.stream(s2):
                        b[0].copy_(b[1], non_blocking=True)
            ev[1].record(s1)
            ev[3].record(s2)
            torch.cuda.synchronize()
            runs.append((ev[0].elapsed_time(ev[1]) / 1e3, ev[2].elapsed_time(ev[3]) / 1e3))
        runs = sorted(runs[1:])  # the first is a warm-up
        mid = runs[len(runs) // 2]
        total = nbytes * count
        return {"pattern": pattern, "bytes": nbytes, "copies": count, "d2h_s": mid[0],
                "h2d_s": mid[1], "d2h_gb_s": total / mid[0] / 1e9,
                "h2d_gb_s": total / mid[1] / 1e9, "reps": reps, "issue": "eager, two streams"}


def measure_link(clock, device, plan: dict, graphs: bool, reps: int, target_s: float,
                 deadline: float, log) -> dict:
    """Every point of ``plan`` (``single``: sizes; ``blocks`` / ``pieces``: counts, with
    ``block_bytes`` / ``piece_bytes``) each direction, then the duplex runs (GPU only),
    while time is left before ``deadline``."""
    bb, pb = plan["block_bytes"], plan["piece_bytes"]
    runs = ([("single", s, 1) for s in plan["single"]]
            + [("blocks", bb, n) for n in plan["blocks"]]
            + [("pieces", pb, n) for n in plan["pieces"]])
    link = HostLink(clock, device, max(s * n for _, s, n in runs))
    out = {"pinned": link.pinned, "points": [], "duplex": [], "skipped": []}
    for pattern, nbytes, count in runs:
        for direction in ("d2h", "h2d"):
            if time.monotonic() > deadline:
                out["skipped"].append({"direction": direction, "pattern": pattern,
                                       "bytes": nbytes, "copies": count,
                                       "reason": "time budget spent"})
                continue
            p = link.measure(direction, pattern, nbytes, count, graphs and not link.graph_failed,
                             reps, target_s)
            out["points"].append(p)
            log(f"link {direction} {pattern:<6} {count:>5} x {nbytes:>11,} B: "
                f"{p['time_s'] * 1e3:9.3f} ms  {p['gb_s']:7.2f} GB/s  ({p['issue'][:40]})")
    if not clock.cuda:
        out["duplex_note"] = "not measured on a CPU device"
        return out
    for pattern, nbytes, count in (("single", max(plan["single"]), 1),
                                   ("blocks", bb, max(plan["blocks"]))):
        if time.monotonic() > deadline:
            break
        d = link.duplex(pattern, nbytes, count, max(3, min(reps, 5)))
        out["duplex"].append(d)
        log(f"link duplex {pattern:<6} {count:>5} x {nbytes:>11,} B: d2h {d['d2h_gb_s']:.2f} "
            f"GB/s, h2d {d['h2d_gb_s']:.2f} GB/s at once")
    return out

