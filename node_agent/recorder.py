"""What the plugin records on the engine's request path, for the snapshot exporter.

``NodeState.observe(policy, ctx, prompt_token_ids, cache_salt=...)`` is called once per real
request, after ``policy.on_request(ctx)`` (O(1) per request; O(anchor) the first time a
fingerprint is seen, and when its anchor grows); ``record_decision(seconds)`` around a
sampled ``order_victims``. The fingerprint, the predicted next agent and the anchor length
come from the policy's introspection interface (``anchorage.policies.base``:
``last_request()``, ``fingerprint_of()``, ``next_agent()``), never from its internals.

Everything is bounded: anchors (``max_anchors``, least recently seen dropped; an anchor
longer than ``max_tokens`` is not kept), recent requests (``max_requests``), sessions whose
next agent is predicted (``max_sessions``), and the sessions' last prompts for reloads
(``max_prompt_tokens`` tokens in all). ``node_agent.exporter`` turns it into the snapshot's
typed sections (``node_agent.snapshot``) from its own thread.

Agents are named by label ``fp:<16 hex>`` (a stable 63-bit hash of the policy's fingerprint
key, ``anchorage.access_log.stable_hash``). Access-log sampling keeps whole sessions with
the same stable hash as ``anchorage.access_log.AccessLogSampler``, so the sidecar's own
sampling keeps exactly these records.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from anchorage.access_log import stable_hash
from anchorage.node_agent.snapshot import AccessRecord, Anchor, DecisionHistogram

DECISION_BUCKETS_S = (1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2)
OUTCOMES = ("correct", "wrong", "none")


def agent_label(key: Hashable) -> str:
    """The public name of a fingerprint key (bytes, int or str)."""
    if isinstance(key, str) and key.startswith("fp:"):
        return key
    return f"fp:{stable_hash(key):016x}"


@dataclass
class AnchorEntry:
    agent: str
    token_ids: list[int]
    hint: str | None
    first_s: float
    last_seen_s: float
    requests: int = 1
    cache_salt: str | None = None   # of the request whose tokens these are
    tenant: str | None = None

    def snapshot(self) -> Anchor:
        return Anchor(agent=self.agent, hint=self.hint, token_ids=self.token_ids,
                      first_s=self.first_s, last_seen_s=self.last_seen_s,
                      requests=self.requests, cache_salt=self.cache_salt, tenant=self.tenant)


class AnchorRegistry:
    """Fingerprint -> anchor token ids, from the first real request seen with it.

    Bounded: ``max_anchors`` entries (least recently seen dropped), anchors longer than
    ``max_tokens`` are not kept (they would not fit a warm-up anyway). An agent's anchor
    grows to the longest shared prefix seen since (its first request shares nothing).

    Each anchor keeps the cache salt (and tenant) of the request its tokens come from: a
    warm-up of the anchor must carry that salt, or it would fill the unsalted cache with a
    tenant's prompt for anyone to hit. (A fingerprint is a salted block key, so one agent
    label never mixes salts.)"""

    def __init__(self, max_anchors: int = 256, max_tokens: int = 32768):
        self.max_anchors = max_anchors
        self.max_tokens = max_tokens
        self.entries: OrderedDict[str, AnchorEntry] = OrderedDict()

    def offer(self, agent: str, token_ids: Callable[[], Sequence[int]] | Sequence[int],
              now_s: float, hint: str | None = None, length: int | None = None,
              cache_salt: str | None = None, tenant: str | None = None) -> None:
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
                e.cache_salt, e.tenant = cache_salt, tenant
            return
        toks = token_ids() if callable(token_ids) else token_ids
        if not toks or len(toks) > self.max_tokens:
            return
        self.entries[agent] = AnchorEntry(agent, [int(t) for t in toks], hint, now_s, now_s,
                                          cache_salt=cache_salt, tenant=tenant)
        while len(self.entries) > self.max_anchors:
            self.entries.popitem(last=False)

    def snapshot(self) -> tuple[Anchor, ...]:
        return tuple(e.snapshot() for e in list(self.entries.values()))


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
    """What the plugin records on the request path for the exporter thread to publish."""

    def __init__(self, block_size: int, *, max_anchors: int = 256, max_requests: int = 512,
                 max_sessions: int = 4096, max_prompt_tokens: int = 262144):
        self.block_size = block_size
        self.anchors = AnchorRegistry(max_anchors)
        self.prompts = SessionPrompts(max_prompt_tokens)
        self.predictions = dict.fromkeys(OUTCOMES, 0)
        self.requests_seen = 0
        self._expect: OrderedDict[Hashable, str | None] = OrderedDict()  # session -> predicted
        self._max_sessions = max_sessions
        self._seen_ids: OrderedDict[Any, None] = OrderedDict()
        self.recent: deque[tuple[int, float, Any]] = deque(maxlen=max_requests)
        self._seq = 0
        self.predictability = 0.0  # set by the exporter thread
        self._labels: dict[Hashable, str] = {}
        self.hist_counts = [0] * (len(DECISION_BUCKETS_S) + 1)
        self.hist_sum = 0.0
        self._sampled: dict[int, AccessRecord | None] = {}  # seq -> record (sampled_requests)
        self._sampled_thr = -1

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
                               length=min(n * self.block_size, len(toks)),
                               cache_salt=cache_salt, tenant=getattr(ctx, "tenant", None))
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

    def histogram(self) -> DecisionHistogram:
        cum, acc = [], 0
        for c in self.hist_counts:
            acc += c
            cum.append(acc)
        return DecisionHistogram(le=list(DECISION_BUCKETS_S) + ["+Inf"], counts=cum,
                                 sum=self.hist_sum, count=acc)

    def sampled_requests(self, sample_rate: float) -> tuple[AccessRecord, ...]:
        if sample_rate <= 0:
            return ()
        thr = int(sample_rate * 10_000)
        recent = list(self.recent)
        memo = self._sampled if self._sampled_thr == thr else {}
        # each request's record (or None: not sampled) is built once, not at every snapshot
        # (the exporter's thread; a request's context does not change once observed)
        keep: dict[int, AccessRecord | None] = {}
        out = []
        for seq, t, c in recent:
            if seq in memo:
                rec = memo[seq]
            else:
                rec = self._record(seq, t, c, thr)
            keep[seq] = rec
            if rec is not None:
                out.append(rec)
        self._sampled, self._sampled_thr = keep, thr
        return tuple(out)

    def _record(self, seq: int, t: float, c: Any, thr: int) -> AccessRecord | None:
        sid = c.session_id
        key = sid if sid is not None else ("request", c.request_id)
        if stable_hash(key) % 10_000 >= thr:
            return None
        n = min(len(c.keys), c.input_length // self.block_size) if self.block_size else 0
        return AccessRecord(
            seq=seq, t=t, hash_ids=[stable_hash(k) for k in list(c.keys[:n])],
            input_length=c.input_length, output_length=c.output_length, session_id=sid,
            tenant=c.tenant, tool_name=c.tool_name, tool_args=c.tool_args,
            agent=c.agent_hint)
