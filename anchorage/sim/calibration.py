"""Fitting the cost model to measured step and copy times; profiles from calibration files.

Specification
-------------
Measurements (``anchorage-calibration/v1``, written by ``scripts/gpu/calibrate.py``; seconds
of GPU time of the whole model's forward on one device):

- prefill points ``{"new_tokens": n, "context_tokens": c, "time_s": t}``: one chunk of ``n``
  new tokens after ``c`` cached ones;
- decode points ``{"batch": b, "context_tokens": c, "time_s": t}``: one step of ``b``
  sequences, each after ``c`` tokens;
- copy points ``{"direction", "pattern", "bytes", "copies", "time_s"}``: ``copies``
  back-to-back transfers of ``bytes`` each.

Step model: ``anchorage.sim.costmodel.step_time_s`` on one device with ``attn_mfu`` set.
Per point, with ``G = 2 P T`` (weight-GEMM FLOPs), ``A`` (attention FLOPs) and ``B``
(bytes) counted as the cost model counts them::

    t = max(G x_g + A x_a, B x_b) + o,   x_g = 1/(peak mfu), x_a = 1/(peak attn_mfu),
                                         x_b = 1/(bw mbu), o = step overhead

``fit_step_model`` assigns each point a regime (compute or memory: the larger term of the
max) from the base profile's coefficients, solves the weighted linear least squares over
rows ``[G, A, 0, 1]`` (compute) or ``[0, 0, B, 1]`` (memory), each row and its target
divided by the measured ``t`` (so it minimises relative errors), re-assigns the regimes
with the fitted coefficients and repeats until they no longer change (at most
``MAX_ROUNDS``). It does so twice, from the base profile's regimes and from prefill =
compute, decode = memory, and keeps the result whose max model has the smaller sum of
squared relative errors. A coefficient no point determines (no memory-bound point, say), or one
fitted <= 0, keeps the base profile's value and a warning says so; a negative ``o`` is
fixed at 0 and the rest refitted. ``peak`` and ``bw`` stay the base profile's datasheet
values: the fitted ``mfu``, ``attn_mfu`` and ``mbu`` are effective efficiencies against
the cost model's own FLOP and byte counts.

Link model, per direction and copy pattern: a run of ``k`` copies of ``s`` bytes takes
``latency + k s / bw`` (the host tier's ``Link``: one transfer of ``k`` blocks);
``fit_link`` solves it by least squares on relative errors as above.

Error report: ``error_pct = 100 (model - measured) / measured`` per point
(``error_rows``, ``link_error_rows``); ``error_summary`` gives the points' median and
largest ``|error_pct|``. ``fit_document`` does all of it on a calibration document.

Profiles: ``profile_from_calibration(data, base=None, host_overhead_s=None,
link_pattern="blocks")`` is the base profile (named in the file's ``profile``; its model's
shape must match the file's) with ``mfu``, ``attn_mfu``, ``mbu`` fitted, ``step_overhead_s
= gpu_step_overhead_s + host_overhead_s`` (the host-side scheduler/sampling time plain
PyTorch cannot see; default the base profile's ``step_overhead_s``, a derived number),
the host link of ``link_pattern`` (``blocks``: the profile's block size, as an offload
copies) and ``source = "measured: <file> ..."``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from anchorage.sim.costmodel import prefill_flops, step_time_s
from anchorage.sim.profiles import PROFILES, HardwareProfile

FORMAT = "anchorage-calibration/v1"
MAX_ROUNDS = 20
COMPUTE, MEMORY = "compute", "memory"
LINK_PATTERNS = ("single", "blocks", "pieces")
DIRECTIONS = ("d2h", "h2d")


@dataclass(frozen=True)
class StepFit:
    mfu: float
    attn_mfu: float
    mbu: float
    gpu_step_overhead_s: float
    regimes: dict[str, list[str]]        # "prefill"/"decode" -> regime per point, in order
    rounds: int
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"mfu": self.mfu, "attn_mfu": self.attn_mfu, "mbu": self.mbu,
                "gpu_step_overhead_s": self.gpu_step_overhead_s, "regimes": self.regimes,
                "rounds": self.rounds, "warnings": list(self.warnings)}


def lstsq(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """Least-squares ``x`` minimising ``|A x - y|`` (columns scaled to unit norm, then
    Householder QR; all-zero columns get 0)."""
    n = len(rows[0]) if rows else 0
    norms = [math.sqrt(sum(r[j] ** 2 for r in rows)) for j in range(n)]
    cols = [j for j in range(n) if norms[j] > 0]
    a = [[r[j] / norms[j] for j in cols] for r in rows]
    b = list(y)
    m, k = len(a), len(cols)
    if m < k:
        raise ValueError(f"{m} points cannot determine {k} coefficients")
    for j in range(k):
        alpha = math.sqrt(sum(a[i][j] ** 2 for i in range(j, m)))
        if alpha == 0:
            raise ValueError("coefficients not determined by the points (collinear)")
        if a[j][j] > 0:
            alpha = -alpha
        v = [0.0] * j + [a[j][j] - alpha] + [a[i][j] for i in range(j + 1, m)]
        vv = sum(x * x for x in v[j:])
        for col in range(j, k):
            s = sum(v[i] * a[i][col] for i in range(j, m)) * 2 / vv
            for i in range(j, m):
                a[i][col] -= s * v[i]
        s = sum(v[i] * b[i] for i in range(j, m)) * 2 / vv
        for i in range(j, m):
            b[i] -= s * v[i]
    x = [0.0] * k
    for j in reversed(range(k)):
        if abs(a[j][j]) < 1e-12 * max(1.0, abs(a[0][0])):
            raise ValueError("coefficients not determined by the points (collinear)")
        x[j] = (b[j] - sum(a[j][c] * x[c] for c in range(j + 1, k))) / a[j][j]
    out = [0.0] * n
    for idx, j in enumerate(cols):
        out[j] = x[idx] / norms[j]
    return out


def _terms(profile: HardwareProfile, prefill: list[tuple[int, int]],
           decode: list[int]) -> tuple[float, float, float]:
    """(G, A, B) of one step, as ``costmodel.step_time_s`` counts them."""
    m = profile.model
    g = a = 0.0
    kv_read = tokens = 0
    for n, c in prefill:
        gi, ai = prefill_flops(m, n, c)
        g, a, kv_read, tokens = g + gi, a + ai, kv_read + c + n, tokens + n
    for c in decode:
        g += 2.0 * m.params
        a += 4.0 * m.layers * m.hidden * (c + 1)
        kv_read, tokens = kv_read + c + 1, tokens + 1
    return g, a, m.weight_bytes + m.kv_bytes_per_token * (kv_read + tokens)


def _steps(prefill_points: Iterable[dict], decode_points: Iterable[dict]):
    """(kind, prefill chunks, decode contexts, measured s) per point, prefill first."""
    for p in prefill_points:
        yield "prefill", [(int(p["new_tokens"]), int(p["context_tokens"]))], [], float(p["time_s"])
    for p in decode_points:
        yield "decode", [], [int(p["context_tokens"])] * int(p["batch"]), float(p["time_s"])


def _coefficients(profile: HardwareProfile) -> list[float]:
    rate = profile.devices * profile.peak_flops
    attn = profile.attn_mfu if profile.attn_mfu is not None else profile.mfu
    return [1 / (rate * profile.mfu), 1 / (rate * attn),
            1 / (profile.devices * profile.mem_bw_bytes_s * profile.mbu),
            profile.step_overhead_s]


def fit_step_model(base: HardwareProfile, prefill_points: Iterable[dict],
                   decode_points: Iterable[dict]) -> StepFit:
    """Fit ``mfu``, ``attn_mfu``, ``mbu`` and the step overhead to measured steps."""
    if base.devices != 1:
        raise ValueError("calibration fits one device (tensor parallelism is not measured)")
    steps = [(kind, *_terms(base, pre, dec), t)
             for kind, pre, dec, t in _steps(prefill_points, decode_points)]
    if not steps or any(not t > 0 for *_, t in steps):
        raise ValueError("need measured points with time_s > 0")
    starts = [None, [COMPUTE if s[0] == "prefill" else MEMORY for s in steps]]
    best = min((_alternate(steps, base, start) for start in starts), key=lambda r: r[0])
    _, x, regimes, rounds, warnings = best
    names = [s[0] for s in steps]
    by_kind = {k: [r for r, n in zip(regimes, names) if n == k] for k in ("prefill", "decode")}
    rate = base.peak_flops
    return StepFit(mfu=1 / (rate * x[0]), attn_mfu=1 / (rate * x[1]),
                   mbu=1 / (base.mem_bw_bytes_s * x[2]), gpu_step_overhead_s=x[3],
                   regimes=by_kind, rounds=rounds, warnings=warnings)


def _alternate(steps, base, regimes):
    """Regimes and least squares in turn from ``regimes`` (None: the base profile's);
    returns (the max model's sum of squared relative errors, x, regimes, rounds,
    warnings)."""
    x = _coefficients(base)
    warnings: list[str] = []
    if regimes is not None:
        x, warnings = _solve(steps, regimes, base)
    for rounds in range(1, MAX_ROUNDS + 1):
        new = [COMPUTE if g * x[0] + a * x[1] >= b * x[2] else MEMORY
               for _, g, a, b, _ in steps]
        if new == regimes:
            break
        regimes = new
        x, warnings = _solve(steps, regimes, base)
    sse = sum(((max(g * x[0] + a * x[1], b * x[2]) + x[3]) / t - 1) ** 2
              for _, g, a, b, t in steps)
    return sse, x, regimes, rounds, warnings


def _solve(steps, regimes, base) -> tuple[list[float], list[str]]:
    """Least squares over the coefficients the points determine; one that comes out <= 0
    is fixed (efficiencies at the base profile's, the overhead at 0) and the rest refitted."""
    rows = []
    for (_, g, a, b, t), r in zip(steps, regimes):
        row = [g, a, 0.0, 1.0] if r == COMPUTE else [0.0, 0.0, b, 1.0]
        rows.append([v / t for v in row])
    fixed = _coefficients(base)
    names = ("mfu", "attn_mfu", "mbu", "step overhead")
    free = [j for j in range(4) if any(r[j] for r in rows)]
    warnings = [f"no {'memory' if j == 2 else 'compute'}-bound point: {names[j]} kept from "
                "the base profile" for j in range(3) if j not in free]
    while True:
        rest = [sum(r[j] * fixed[j] for j in range(4) if j not in free) for r in rows]
        sol = lstsq([[r[j] for j in free] for r in rows], [1.0 - v for v in rest])
        x = list(fixed)
        for j, v in zip(free, sol):
            x[j] = v
        bad = [j for j in free if not x[j] > 0 and (j != 3 or x[j] < 0)]
        if not bad:
            return x, warnings
        j = bad[0]
        free.remove(j)
        if j == 3:
            fixed[3] = 0.0
            warnings.append("fitted step overhead < 0: fixed at 0")
        else:
            warnings.append(f"{names[j]} fitted <= 0: kept from the base profile")


def fitted_profile(base: HardwareProfile, fit: StepFit, **changes) -> HardwareProfile:
    """The base profile with the fit's coefficients (GPU-side overhead only)."""
    return base.with_(mfu=fit.mfu, attn_mfu=fit.attn_mfu, mbu=fit.mbu,
                      step_overhead_s=fit.gpu_step_overhead_s, **changes)


def error_rows(profile: HardwareProfile, prefill_points: Iterable[dict],
               decode_points: Iterable[dict]) -> dict[str, list[dict]]:
    """Model (``step_time_s``) against measurement per point."""
    out: dict[str, list[dict]] = {"prefill": [], "decode": []}
    pre, dec = list(prefill_points), list(decode_points)
    for point, (kind, chunks, ctxs, t) in zip(pre + dec, _steps(pre, dec)):
        model = step_time_s(profile, chunks, ctxs)
        keys = ("new_tokens", "context_tokens") if kind == "prefill" else ("batch",
                                                                           "context_tokens")
        out[kind].append({**{k: point[k] for k in keys}, "measured_s": t, "model_s": model,
                          "error_pct": 100.0 * (model - t) / t})
    return out


def fit_link(points: Iterable[dict]) -> dict:
    """``{"bytes_s", "latency_s"}`` of ``t = latency + copies x bytes / bw`` (one
    direction and pattern); ValueError when the bytes explain under 1 % of the largest
    point's time (no bandwidth to fit)."""
    pts = [p for p in points if float(p["time_s"]) > 0]
    if not pts:
        raise ValueError("no copy points")
    totals = [float(p["bytes"]) * int(p["copies"]) for p in pts]
    ts = [float(p["time_s"]) for p in pts]
    if len({*totals}) < 2:
        return {"bytes_s": sum(totals) / sum(ts), "latency_s": 0.0}
    lat, inv_bw = lstsq([[1 / t, s / t] for s, t in zip(totals, ts)], [1.0] * len(ts))
    if lat < 0:
        inv_bw = sum(s / t for s, t in zip(totals, ts)) / sum((s / t) ** 2
                                                              for s, t in zip(totals, ts))
        lat = 0.0
    big = max(range(len(ts)), key=totals.__getitem__)
    if not inv_bw * totals[big] > 0.01 * ts[big]:  # bytes explain under 1 % of the largest
        raise ValueError("copy times do not grow with size: no bandwidth to fit")
    return {"bytes_s": 1 / inv_bw, "latency_s": lat}


def fit_links(points: Iterable[dict]) -> tuple[dict, list[str]]:
    """``fit_link`` per pattern and direction: ``({pattern: {direction: fit}}, warnings)``;
    a set of points that fits no link is left out, and a warning says why."""
    pts = list(points)
    out: dict = {}
    warnings = []
    for pattern in LINK_PATTERNS:
        for d in DIRECTIONS:
            sel = [p for p in pts if p["pattern"] == pattern and p["direction"] == d]
            if not sel:
                continue
            try:
                out.setdefault(pattern, {})[d] = fit_link(sel)
            except ValueError as exc:
                warnings.append(f"link {pattern} {d}: {exc}")
    return {k: v for k, v in out.items() if v}, warnings


def link_error_rows(points: Iterable[dict], links: dict) -> list[dict]:
    rows = []
    for p in points:
        f = links.get(p["pattern"], {}).get(p["direction"])
        if f is None:
            continue
        t = float(p["time_s"])
        model = f["latency_s"] + float(p["bytes"]) * int(p["copies"]) / f["bytes_s"]
        rows.append({k: p[k] for k in ("direction", "pattern", "bytes", "copies")}
                    | {"measured_s": t, "model_s": model, "error_pct": 100 * (model - t) / t})
    return rows


def duplex_factors(link: dict) -> list[dict]:
    """Per duplex run and direction: throughput with both directions busy / alone (the
    matching single-direction point)."""
    solo = {(p["pattern"], p["bytes"], p["copies"], p["direction"]): p["gb_s"]
            for p in link.get("points", [])}
    out = []
    for d in link.get("duplex", []):
        for direction in DIRECTIONS:
            alone = solo.get((d["pattern"], d["bytes"], d["copies"], direction))
            if alone:
                out.append({"pattern": d["pattern"], "direction": direction,
                            "factor": d[f"{direction}_gb_s"] / alone})
    return out


def fit_document(doc: dict, base: HardwareProfile) -> None:
    """Fit a calibration document's measurements: sets ``doc["fit"]`` (``StepFit`` fields,
    ``link``: ``fit_links``, ``duplex``: ``duplex_factors``) and ``doc["errors"]``
    (``prefill`` / ``decode`` / ``link`` rows and a ``summary`` of each)."""
    meas = doc["measurements"]
    step = fit_step_model(base, meas["prefill"], meas["decode"])
    errors = error_rows(fitted_profile(base, step), meas["prefill"], meas["decode"])
    link = meas.get("link") or {}
    links, link_warnings = fit_links(link.get("points", []))
    errors["link"] = link_error_rows(link.get("points", []), links)
    doc["fit"] = {**step.to_json(), "link": links, "duplex": duplex_factors(link)}
    doc["fit"]["warnings"] += link_warnings
    doc["errors"] = {**errors, "summary": {k: error_summary(v) for k, v in errors.items()}}


def error_summary(rows: Iterable[dict]) -> dict:
    errs = sorted(abs(r["error_pct"]) for r in rows)
    if not errs:
        return {"points": 0, "median_abs_pct": None, "max_abs_pct": None}
    mid = len(errs) // 2
    median = errs[mid] if len(errs) % 2 else (errs[mid - 1] + errs[mid]) / 2
    return {"points": len(errs), "median_abs_pct": median, "max_abs_pct": errs[-1]}


def load_calibration(path: str) -> dict:
    """A calibration file's object; ValueError with the reason if it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read calibration file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not an {FORMAT} file")
    for key in ("profile", "model", "fit", "device"):
        if key not in data:
            raise ValueError(f"{path}: no {key!r} in the calibration")
    return data


def profile_from_calibration(data: dict, base: HardwareProfile | None = None,
                             path: str = "<calibration>", host_overhead_s: float | None = None,
                             link_pattern: str = "blocks") -> HardwareProfile:
    """The measured profile (module docstring)."""
    if base is None:
        name = data["profile"]
        if name not in PROFILES:
            raise ValueError(f"{path}: calibration of unknown profile {name!r}")
        base = PROFILES[name]
    shape = ("layers", "hidden", "kv_heads", "head_dim")
    m = data["model"]
    if any(m.get(k) != getattr(base.model, k) for k in shape):
        raise ValueError(f"{path}: measured model {m.get('name')} "
                         f"({', '.join(f'{k} {m.get(k)}' for k in shape)}) is not "
                         f"{base.name}'s {base.model.name}")
    if link_pattern not in LINK_PATTERNS:
        raise ValueError(f"link_pattern must be one of {', '.join(LINK_PATTERNS)}")
    fit = data["fit"]
    host = base.step_overhead_s if host_overhead_s is None else host_overhead_s
    link = fit.get("link", {}).get(link_pattern, {})
    dev = data["device"]
    source = (f"measured: {path} ({dev.get('name', '?')}, torch {dev.get('torch', '?')}, "
              f"{data.get('created_utc', '?')}); step overhead = measured GPU "
              f"{fit['gpu_step_overhead_s'] * 1e3:.3f} ms + derived host-side "
              f"{host * 1e3:.3f} ms; host link: {link_pattern} copies"
              + ("" if link else " not measured (defaults)"))
    changes = {"mfu": fit["mfu"], "attn_mfu": fit["attn_mfu"], "mbu": fit["mbu"],
               "step_overhead_s": fit["gpu_step_overhead_s"] + host, "source": source}
    if "d2h" in link:
        changes.update(host_d2h_bytes_s=link["d2h"]["bytes_s"],
                       host_link_latency_s=link["d2h"]["latency_s"])
    if "h2d" in link:
        changes["host_h2d_bytes_s"] = link["h2d"]["bytes_s"]
        if "d2h" in link:  # the host tier has one latency for both directions
            changes["host_link_latency_s"] = max(link["d2h"]["latency_s"],
                                                 link["h2d"]["latency_s"])
        else:
            changes["host_link_latency_s"] = link["h2d"]["latency_s"]
    for k in ("mfu", "attn_mfu", "mbu"):
        if not (isinstance(changes[k], (int, float)) and changes[k] > 0):
            raise ValueError(f"{path}: fitted {k} must be > 0, got {changes[k]!r}")
    return base.with_(**changes)
