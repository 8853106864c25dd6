"""The contract between the vLLM plugin (inside EngineCore) and the node-agent sidecar.

The plugin owns the policy; the sidecar owns everything slow (HTTP, Prometheus, warm-ups,
the access log). They share one file, ``$ANCHORAGE_STATE_DIR/state.json``, written by the
plugin atomically (tmp file + ``os.replace``) every ``interval_s`` from a daemon thread,
never on the allocation path, and read by the sidecar whenever it likes.

Snapshot (``anchorage-node-state/v1``, JSON object)::

    format, written_s (unix time), pid, policy, mode ("active" | "stock"),
    config_generation, block_size,
    predictability            R in [0, 1] (CacheScout eq. 2)
    predictions               [{"agent": label, "probability": p}], best first
    counters                  {"evictions": {reason: n}, "policy_errors": n,
                               "predictions": {"correct"|"wrong"|"none": n}, "requests": n}
    protected_blocks          {"anchor": n, "session": n}
    decision_seconds          {"le": [...], "counts": [...cumulative], "sum": s, "count": n}
    anchors                   [{"agent", "hint", "token_ids", "first_s", "last_seen_s",
                                "requests"}]  (bounded registry; longest shared prefix seen)
    requests                  [{"seq", "t", "hash_ids", "input_length", "output_length",
                                "session_id", "tenant", "tool_name", "tool_args", "agent"}]
                              (recent real requests of sampled sessions, for the access log)

Agents are named by label ``fp:<16 hex>`` (a stable 63-bit hash of the policy's
fingerprint key, ``anchorage.access_log.stable_hash``), so the plugin's bytes keys never
leave the engine. ``predictions[*].probability`` is the chance that at least one active
session calls the agent next, ``1 - exp(-s)`` with ``s = sum_i N_i P(j | i)`` from
``PrefetchAdvisor.warm_candidates`` (Poisson approximation).

In the engine (what the plugin calls)::

    state = NodeState(block_size=pool.hash_block_size)
    exporter = PolicyStateExporter(policy, state_path(), node_state=state,
                                   stats=block_pool_stats(name), policy_name=name,
                                   config_generation=lambda: generation_in_force).start()
    # after policy.on_request(ctx), with the vLLM Request in hand:
    state.observe(policy, ctx, request.prompt_token_ids)
    # around order_victims, sampled:  state.record_decision(seconds)
    exporter.stop()  # at shutdown (also a daemon thread: never blocks exit)

The access-log sample rate is the sidecar's (``--access-log-sample-rate``); it tells the
plugin through ``sidecar.json`` in the same directory (``write_settings``), read by the
exporter at each interval; whole sessions are sampled with the same stable hash as
``AccessLogSampler``, so the sidecar's own sampling keeps exactly these records.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anchorage.access_log import stable_hash

log = logging.getLogger("anchorage.node_agent.state")

FORMAT = "anchorage-node-state/v1"
SNAPSHOT_FILE = "state.json"
SETTINGS_FILE = "sidecar.json"
ENV_STATE_DIR = "ANCHORAGE_STATE_DIR"
DECISION_BUCKETS_S = (1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2)
OUTCOMES = ("correct", "wrong", "none")


class StateError(ValueError):
    """A snapshot that cannot be read (message names the file and the problem)."""


def state_path(state_dir: str | os.PathLike | None = None) -> Path:
    d = state_dir if state_dir is not None else os.environ.get(ENV_STATE_DIR) or "/tmp/anchorage"
    return Path(d) / SNAPSHOT_FILE


def agent_label(key: Hashable) -> str:
    """The public name of a fingerprint key (bytes, int or str)."""
    if isinstance(key, str) and key.startswith("fp:"):
        return key
    return f"fp:{stable_hash(key):016x}"


# -- in the engine ------------------------------------------------------------------------


@dataclass
class AnchorEntry:
    agent: str
    token_ids: list[int]
    hint: str | None
    first_s: float
    last_seen_s: float
    requests: int = 1


class AnchorRegistry:
    """Fingerprint -> anchor token ids, from the first real request seen with it.

    Bounded: ``max_anchors`` entries (least recently seen dropped), anchors longer than
    ``max_tokens`` are not kept (they would not fit a warm-up anyway). An agent's anchor
    grows to the longest shared prefix seen since (its first request shares nothing)."""

    def __init__(self, max_anchors: int = 256, max_tokens: int = 32768):
        self.max_anchors = max_anchors
        self.max_tokens = max_tokens
        self.entries: OrderedDict[str, AnchorEntry] = OrderedDict()

    def offer(self, agent: str, token_ids: Callable[[], Sequence[int]] | Sequence[int],
              now_s: float, hint: str | None = None, length: int | None = None) -> None:
        """``length``: how many tokens ``token_ids`` gives (lets a known agent's anchor
        grow without building the list: the first request of an agent shares nothing
        yet, so its anchor is learnt longer as later requests share more)."""
        e = self.entries.get(agent)
        if e is not None:
            e.last_seen_s = now_s
            e.requests += 1
            if hint is not None and e.hint is None:
                e.hint = hint
            self.entries.move_to_end(agent)
            if length is not None and len(e.token_ids) < length <= self.max_tokens:
                e.token_ids = [int(t) for t in (token_ids() if callable(token_ids)
                                                else token_ids)]
            return
        toks = token_ids() if callable(token_ids) else token_ids
        if not toks or len(toks) > self.max_tokens:
            return
        self.entries[agent] = AnchorEntry(agent, [int(t) for t in toks], hint, now_s, now_s)
        while len(self.entries) > self.max_anchors:
            self.entries.popitem(last=False)

    def to_json(self) -> list[dict[str, Any]]:
        return [{"agent": e.agent, "hint": e.hint, "token_ids": e.token_ids, "first_s": e.first_s,
                 "last_seen_s": e.last_seen_s, "requests": e.requests}
                for e in list(self.entries.values())]


class SessionPrompts:
    """Session -> its last real prompt's token ids and cache salt, for the temporal
    controller's reload warm-ups (``node_agent.temporal``). Only requests that carry a
    pending tool are kept (the ones that stall). Bounded by ``max_tokens`` in total: the
    least recently updated sessions are dropped first. O(1) per request: the engine's
    prompt list is referenced, not copied (vLLM does not change a request's prompt)."""

    def __init__(self, max_tokens: int = 262144):
        self.max_tokens = max_tokens
        self.total = 0
        self.entries: OrderedDict[str, tuple[Sequence[int], str | None]] = OrderedDict()

    def offer(self, session: str, token_ids: Sequence[int], cache_salt: str | None) -> None:
        old = self.entries.pop(session, None)
        if old is not None:
            self.total -= len(old[0])
        if not token_ids or len(token_ids) > self.max_tokens:
            return
        self.entries[session] = (token_ids, cache_salt)
        self.total += len(token_ids)
        while self.total > self.max_tokens:
            _, (toks, _) = self.entries.popitem(last=False)
            self.total -= len(toks)

    def get(self, session: str) -> tuple[list[int], str | None] | None:
        e = self.entries.get(session)
        return None if e is None else ([int(t) for t in e[0]], e[1])


class NodeState:
    """What the plugin records on the request path (O(1) per request, O(anchor) the first
    time a fingerprint is seen) for the exporter thread to publish."""

    def __init__(self, block_size: int, *, max_anchors: int = 256, max_requests: int = 512,
                 max_sessions: int = 4096, max_prompt_tokens: int = 262144):
        self.block_size = block_size
        self.anchors = AnchorRegistry(max_anchors)
        self.prompts = SessionPrompts(max_prompt_tokens)
        self.predictions = dict.fromkeys(OUTCOMES, 0)
        self.requests_seen = 0
        self.evictions: dict[str, int] = {}
        self._expect: OrderedDict[Hashable, str | None] = OrderedDict()  # session -> predicted
        self._max_sessions = max_sessions
        self._seen_ids: OrderedDict[Any, None] = OrderedDict()
        self.recent: deque[tuple[int, float, Any]] = deque(maxlen=max_requests)
        self._seq = 0
        self.predictability = 0.0  # set by the exporter thread
        self._labels: dict[Hashable, str] = {}
        self.hist_counts = [0] * (len(DECISION_BUCKETS_S) + 1)
        self.hist_sum = 0.0

    def observe(self, policy: Any, ctx: Any, prompt_token_ids: Sequence[int] | None,
                now_s: float | None = None, cache_salt: str | None = None) -> None:
        """One real request, after ``policy.on_request(ctx)``. Warm-ups and repeated
        scheduling attempts of the same request are ignored."""
        if getattr(ctx, "warmup", False):
            return
        rid = getattr(ctx, "request_id", None)
        if rid is not None:
            if rid in self._seen_ids:
                return
            self._seen_ids[rid] = None
            if len(self._seen_ids) > 4 * self._max_sessions:
                self._seen_ids.popitem(last=False)
        sid = getattr(ctx, "session_id", None)
        if (sid is not None and prompt_token_ids is not None
                and getattr(ctx, "tool_name", None) is not None):
            self.prompts.offer(sid, prompt_token_ids, cache_salt)
        now = time.time() if now_s is None else now_s
        self.requests_seen += 1
        self._seq += 1
        self.recent.append((self._seq, now, ctx))
        fp, n = self._fingerprint(policy, ctx.keys)
        if fp is None:
            return
        label = self._label(fp)
        if n and prompt_token_ids is not None:
            toks = prompt_token_ids
            self.anchors.offer(label, lambda: list(toks[: n * self.block_size]), now,
                               getattr(ctx, "agent_hint", None),
                               length=min(n * self.block_size, len(toks)))
        sid = getattr(ctx, "session_id", None)
        if sid is not None:
            if sid in self._expect:
                exp = self._expect[sid]
                self.predictions["none" if exp is None else
                                 "correct" if exp == label else "wrong"] += 1
                self._expect.move_to_end(sid)
            self._expect[sid] = self._predict(policy, fp, self.predictability)
            while len(self._expect) > self._max_sessions:
                self._expect.popitem(last=False)

    @staticmethod
    def _fingerprint(policy: Any, keys: Sequence[Hashable]) -> tuple[Hashable | None, int]:
        """(fingerprint, anchor length in blocks) of the request the policy just saw:
        its ``last_request()`` when that is this request, else from ``fingerprint_of``."""
        ins = policy.last_request()
        if ins is not None and ins.fingerprint is not None:
            fp = ins.fingerprint
            n = max(ins.anchor_blocks, 1)
            if n <= len(keys) and keys[n - 1] == fp:
                return fp, n
        fp = policy.fingerprint_of(keys)
        if fp is None:
            return None, 0
        for i, k in enumerate(keys):
            if k == fp:
                return fp, i + 1
        return fp, 0

    def _label(self, fp: Hashable) -> str:
        lab = self._labels.get(fp)
        if lab is None:
            lab = self._labels[fp] = agent_label(fp)
            if len(self._labels) > 4 * self.anchors.max_anchors:
                self._labels.pop(next(iter(self._labels)))
        return lab

    def _predict(self, policy: Any, fp: Hashable, r: float, r_min: float = 0.3) -> str | None:
        """The session's predicted next agent, None below the gate. ``r`` is the last R
        the exporter computed (O(agents^2): never on the request path)."""
        if r < r_min:
            return None
        nxt, _ = policy.next_agent(fp)
        return None if nxt is None or not isinstance(nxt, (bytes, int, str)) else self._label(nxt)

    def record_decision(self, seconds: float) -> None:
        i = 0
        while i < len(DECISION_BUCKETS_S) and seconds > DECISION_BUCKETS_S[i]:
            i += 1
        self.hist_counts[i] += 1
        self.hist_sum += seconds

    def count_eviction(self, reason: str, n: int = 1) -> None:
        self.evictions[reason] = self.evictions.get(reason, 0) + n

    def histogram(self) -> dict[str, Any]:
        cum, acc = [], 0
        for c in self.hist_counts:
            acc += c
            cum.append(acc)
        return {"le": list(DECISION_BUCKETS_S) + ["+Inf"], "counts": cum, "sum": self.hist_sum,
                "count": acc}

    def sampled_requests(self, sample_rate: float) -> list[dict[str, Any]]:
        if sample_rate <= 0:
            return []
        thr = int(sample_rate * 10_000)
        out = []
        for seq, t, c in list(self.recent):
            sid = c.session_id
            key = sid if sid is not None else ("request", c.request_id)
            if stable_hash(key) % 10_000 >= thr:
                continue
            n = min(len(c.keys), c.input_length // self.block_size) if self.block_size else 0
            out.append({"seq": seq, "t": t,
                        "hash_ids": [stable_hash(k) for k in list(c.keys[:n])],
                        "input_length": c.input_length, "output_length": c.output_length,
                        "session_id": sid, "tenant": c.tenant, "tool_name": c.tool_name,
                        "tool_args": c.tool_args, "agent": c.agent_hint})
        return out


def policy_view(policy: Any, k: int = 8) -> dict[str, Any]:
    """Predictability, predictions and protected blocks of a policy, through its
    introspection interface (``anchorage.policies.base``; read from another thread: a
    concurrent change of a dict during iteration raises RuntimeError, which the exporter
    retries)."""
    out: dict[str, Any] = {"policy": getattr(policy, "name", None), "predictability": 0.0,
                           "predictions": [], "protected_blocks": {"anchor": 0, "session": 0}}
    tiering = policy.tiering_view()  # ANCHORAGE_TIERING (node_agent/tiering)
    if tiering is not None:
        out["tiering"] = tiering
    from anchorage.policies.cachescout import PrefetchAdvisor

    adv = PrefetchAdvisor(policy)
    out["predictability"] = float(adv.predictability())
    out["predictions"] = [{"agent": agent_label(a), "probability": round(1 - math.exp(-s), 6)}
                          for a, s in adv.warm_candidates(k) if s > 0 and a is not None
                          and isinstance(a, (bytes, int, str))]
    out["protected_blocks"] = dict(policy.protected_blocks())
    return out


def _with_prompts(tiering: dict[str, Any] | None, st: NodeState | None) -> dict[str, Any] | None:
    """The temporal controller's pending reloads with the session's last prompt (token ids
    and cache salt) from the plugin's registry; a reload whose prompt is unknown is left
    out (nothing to warm)."""
    if not tiering or "pending_reloads" not in tiering:
        return tiering
    out = dict(tiering)
    pend = []
    for r in tiering["pending_reloads"]:
        p = st.prompts.get(r["session"]) if st is not None else None
        if p is not None:
            pend.append({**r, "token_ids": p[0], "cache_salt": p[1]})
    out["pending_reloads"] = pend
    return out


def block_pool_stats(policy_name: str) -> Callable[[], dict[str, Any]]:
    """The exporter's ``stats`` from the block-pool driver's process-wide counters:
    victims in the policy's order (reason ``lru`` for the ``lru`` policy, else ``policy``),
    victims in stock recency order (``lru``: the policy had none left, or it failed),
    policy errors."""

    def stats() -> dict[str, Any]:
        from anchorage.node_agent.vllm_block_pool import STATS

        ev: dict[str, int] = {}
        ev["lru" if policy_name == "lru" else "policy"] = STATS.victims
        ev["lru"] = ev.get("lru", 0) + STATS.stock_victims
        return {"evictions": ev, "policy_errors": STATS.errors}

    return stats


def write_snapshot(path: str | os.PathLike, snap: dict[str, Any]) -> None:
    """Atomic: readers see the previous file or this one, never a partial write."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    data = json.dumps(snap, separators=(",", ":"))
    with open(tmp, "w") as fh:
        fh.write(data)
    os.replace(tmp, p)


def write_settings(state_dir: str | os.PathLike, *, access_log_sample_rate: float) -> None:
    write_snapshot(Path(state_dir) / SETTINGS_FILE,
                   {"access_log_sample_rate": float(access_log_sample_rate)})


def read_settings(state_dir: str | os.PathLike) -> dict[str, Any]:
    try:
        doc = json.loads((Path(state_dir) / SETTINGS_FILE).read_text())
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


class PolicyStateExporter:
    """Writes the snapshot every ``interval_s`` from a daemon thread.

    ``policy_or_callable``: an eviction policy (its learned model is read with
    ``policy_view``) or a zero-argument callable returning the ``policy_view`` fields
    (stubs, or a plugin that builds them itself). ``stats``: optional callable returning
    ``{"evictions": {reason: n}, "policy_errors": n}`` (the block-pool driver's counters).
    """

    def __init__(self, policy_or_callable: Any, path: str | os.PathLike | None = None,
                 interval_s: float = 0.5, *, node_state: NodeState | None = None,
                 stats: Callable[[], dict[str, Any]] | None = None, mode: str = "active",
                 policy_name: str | None = None,
                 config_generation: Callable[[], int] | int = 0):
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.source = policy_or_callable
        self.path = Path(path) if path is not None else state_path()
        self.interval_s = interval_s
        self.node_state = node_state
        self.stats = stats
        self.mode = mode
        self.policy_name = policy_name
        self.config_generation = config_generation
        self.writes = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_view: dict[str, Any] = {}

    def _view(self) -> dict[str, Any]:
        src = self.source
        for _ in range(3):
            try:
                if callable(src) and not hasattr(src, "pop_victim"):
                    v = dict(src())
                else:
                    v = policy_view(src)
                self._last_view = v
                return v
            except RuntimeError:  # the engine thread changed a dict under us: retry
                continue
        return self._last_view

    def snapshot(self) -> dict[str, Any]:
        v = self._view()
        st = self.node_state
        if st is not None:
            st.predictability = float(v.get("predictability", 0.0))
        stats = self.stats() if self.stats is not None else {}
        gen = self.config_generation() if callable(self.config_generation) else self.config_generation
        evictions = dict(stats.get("evictions", {}))
        if st is not None:
            for r, n in st.evictions.items():
                evictions[r] = evictions.get(r, 0) + n
        rate = float(read_settings(self.path.parent).get("access_log_sample_rate", 0.0) or 0.0)
        return {
            "format": FORMAT, "written_s": time.time(), "pid": os.getpid(),
            "policy": self.policy_name or v.get("policy") or "off", "mode": self.mode,
            "config_generation": int(gen or 0),
            "block_size": st.block_size if st is not None else v.get("block_size", 0),
            "predictability": float(v.get("predictability", 0.0)),
            "predictions": list(v.get("predictions", [])),
            "counters": {"evictions": evictions,
                         "policy_errors": int(stats.get("policy_errors", 0)),
                         "predictions": dict(st.predictions) if st is not None
                         else dict.fromkeys(OUTCOMES, 0),
                         "requests": st.requests_seen if st is not None else 0},
            "protected_blocks": dict(v.get("protected_blocks", {"anchor": 0, "session": 0})),
            "decision_seconds": st.histogram() if st is not None else None,
            "anchors": st.anchors.to_json() if st is not None else list(v.get("anchors", [])),
            "requests": st.sampled_requests(rate) if st is not None else [],
            "tiering": _with_prompts(v.get("tiering"), st),  # None unless ANCHORAGE_TIERING
        }

    def write_once(self) -> None:
        try:
            write_snapshot(self.path, self.snapshot())
            self.writes += 1
        except Exception:
            self.errors += 1
            if self.errors == 1:
                log.warning("anchorage: cannot write the node state to %s", self.path,
                            exc_info=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.write_once()
            self._stop.wait(self.interval_s)

    def start(self) -> PolicyStateExporter:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="anchorage-state-exporter")
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None


# -- in the sidecar -----------------------------------------------------------------------


@dataclass
class Snapshot:
    written_s: float
    policy: str
    mode: str
    config_generation: int
    block_size: int
    predictability: float
    predictions: list[tuple[str, float]]
    counters: dict[str, Any]
    protected_blocks: dict[str, int]
    decision_seconds: dict[str, Any] | None
    anchors: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    pid: int | None = None
    tiering: dict[str, Any] | None = None


def _tiering(doc: Any, where: str) -> dict[str, Any] | None:
    """The snapshot's ``tiering`` section: ``{"mode", "reserved_blocks": {agent: n}}`` and,
    from an engine that offloads, ``offloads``/``reloads``/``bytes`` ({label: n})."""
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise StateError(f"{where}: tiering must be an object")
    out: dict[str, Any] = {"mode": str(doc.get("mode", "spatial"))}
    for k in ("reserved_blocks", "offloads", "reloads", "bytes"):
        if k in doc:
            v = doc[k]
            if not isinstance(v, dict):
                raise StateError(f"{where}: tiering.{k} must be an object")
            out[k] = {str(a): int(n) for a, n in v.items()}
    if "pending_reloads" in doc:
        out["pending_reloads"] = _pending_reloads(doc["pending_reloads"], where)
    return out


def _pending_reloads(doc: Any, where: str) -> list[dict[str, Any]]:
    """``tiering.pending_reloads``: [{"id", "session", "at_s", "blocks", "token_ids",
    "cache_salt", "agent", "tenant"}] (the temporal controller's scheduled warm-ups)."""
    if not isinstance(doc, list):
        raise StateError(f"{where}: tiering.pending_reloads must be a list")
    out = []
    for r in doc:
        if not isinstance(r, dict):
            raise StateError(f"{where}: tiering.pending_reloads entries must be objects")
        toks = r.get("token_ids")
        if not isinstance(toks, list) or not toks or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in toks):
            raise StateError(f"{where}: pending reload {r.get('id')!r}: token_ids must be "
                             f"a non-empty list of ints")
        opt = {k: (r.get(k) if isinstance(r.get(k), str) else None)
               for k in ("cache_salt", "agent", "tenant")}
        out.append({"id": str(r["id"]), "session": str(r["session"]),
                    "at_s": float(r["at_s"]), "blocks": int(r.get("blocks", 0)),
                    "token_ids": toks, **opt})
    return out


def parse_snapshot(doc: Any, where: str = "snapshot") -> Snapshot:
    if not isinstance(doc, dict):
        raise StateError(f"{where}: not a JSON object")
    if doc.get("format") != FORMAT:
        raise StateError(f"{where}: format {doc.get('format')!r}, expected {FORMAT!r}")
    try:
        preds = [(str(p["agent"]), float(p["probability"])) for p in doc.get("predictions", [])]
        anchors = {}
        for a in doc.get("anchors", []):
            toks = a["token_ids"]
            if not isinstance(toks, list) or not all(isinstance(t, int) for t in toks):
                raise StateError(f"{where}: anchor {a.get('agent')!r}: token_ids must be ints")
            anchors[str(a["agent"])] = a
        return Snapshot(
            written_s=float(doc["written_s"]), policy=str(doc.get("policy", "off")),
            mode=str(doc.get("mode", "stock")),
            config_generation=int(doc.get("config_generation", 0)),
            block_size=int(doc.get("block_size", 0)),
            predictability=float(doc.get("predictability", 0.0)), predictions=preds,
            counters=dict(doc.get("counters", {})),
            protected_blocks={str(k): int(v) for k, v in doc.get("protected_blocks", {}).items()},
            decision_seconds=doc.get("decision_seconds"), anchors=anchors,
            requests=list(doc.get("requests", [])),
            pid=doc.get("pid") if isinstance(doc.get("pid"), int) else None,
            tiering=_tiering(doc.get("tiering"), where))
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, StateError):
            raise
        raise StateError(f"{where}: malformed field ({exc.__class__.__name__}: {exc})") from None


def read_snapshot(path: str | os.PathLike) -> Snapshot | None:
    """The plugin's latest snapshot; None when there is none yet."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise StateError(f"{path}: not JSON ({exc})") from None
    return parse_snapshot(doc, str(path))
