"""When each session is expected back: the prediction the host-tier policy orders host
memory by (``anchorage.tiering.host_policy``), for the engine's offload connector and the
simulator alike, on top of the one temporal controller (``anchorage.tiering.controller``).

Specification
-------------
Fed by the adapter, per request (plain values):

- ``request(rid, sid, now, tool, args, warmup, agent, tenant)``: a request of session
  ``sid`` arrived (``tool``/``args``: the tool call its turn ends with, the metadata's
  pending tool). A real request makes the session *active* until it finishes; its arrival
  closes the session's stall (``TemporalController.returned``: the gap feeds the
  forecaster) or, after a turn without a tool, feeds the gap to the forecaster under the
  context ``NO_TOOL``; a session counted as ended comes back: its end is retracted. A
  warm-up (``warmup``) changes nothing here (its reload is the controller's business).
- ``finished(rid, now, next_gap_s=None)``: the request finished: the session's turn ended
  at ``now``. With a tool the controller opens the stall (``turn_end``) and it is returned
  for the adapter to plan (``TemporalController.plan`` over its readings). ``next_gap_s``:
  the true gap to the session's next request (None: it has none), read only with
  ``oracle`` (the simulator's bound).

``next_use_s(sid, now)``, the predicted absolute time of the session's next use of its KV:

- unknown session: None (the policy orders its keys by recency);
- active: ``now``;
- ``oracle``: the true next arrival (``end + next_gap_s``; inf for a session's last turn);
- ended: inf. A session idle longer than ``end_factor`` (default 2) x the 99th percentile
  of all learned gaps (once ``min_gaps``, default 16, are learned) is ended: its end is
  recorded in its context's histogram (``GapPredictor.observe_end``), so ``P(return)``
  falls for that context;
- otherwise ``now + w + wait``: ``w = GapHistogram.expected_wait(e)`` (``E[tau - e | tau >
  e] / P(return | tau > e)``, the expected time per reuse, as the GPU policy scores a
  session's thread, ``anchorage.policies.group_eviction``) of the most specific histogram
  of the session's context (its tool and argument cluster, or ``NO_TOOL``) with enough
  samples (else the histogram of all gaps), ``e`` the time since the turn ended; without
  one, a turn that ended in a tool
  call uses the forecaster's fallback (``StallForecaster.predict``: the tool's EWMA, else
  the default stall), and a turn without a tool is ordered by recency (``w = e``, ``wait =
  0``: LRU among such sessions); ``wait``: the controller's admission-wait EWMA with
  ``queue_wait``.

``pinned(key)``: the key belongs to a session the controller offloaded and that is not back
yet (``TemporalController.pins``: the stall's host occupancy).

Bounds: at most ``max_sessions`` sessions (oldest dropped) and ``max_requests`` request ids
(the rid -> session map, kept after a request finishes: vLLM's connector reports a
request's host accesses to the policy after it finished).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from anchorage.tiering.controller import Stall, TemporalController
from anchorage.tiering.params import TemporalParams

NO_TOOL = "<no tool>"  # the forecaster's context for gaps after a turn without a tool call


class _Session:
    __slots__ = ("active", "args", "end_s", "ended", "next_s", "tool")

    def __init__(self) -> None:
        self.active = 0
        self.end_s: float | None = None
        self.tool: Hashable | None = None
        self.args: Any = None
        self.ended = False
        self.next_s = math.inf  # oracle only


class SessionReturns:
    def __init__(self, params: TemporalParams | None = None, *, end_factor: float = 2.0,
                 min_gaps: int = 16, max_sessions: int = 4096, max_requests: int = 8192,
                 oracle: bool = False, controller: TemporalController | None = None):
        if not end_factor > 0 or min_gaps < 1 or max_sessions < 1 or max_requests < 1:
            raise ValueError("end_factor must be > 0; min_gaps, max_sessions and "
                             "max_requests >= 1")
        self.ctl = controller if controller is not None else TemporalController(
            params or TemporalParams())
        self.end_factor = end_factor
        self.min_gaps = min_gaps
        self.max_sessions = max_sessions
        self.max_requests = max_requests
        self.oracle = oracle
        self.sessions: OrderedDict[Hashable, _Session] = OrderedDict()
        self.rids: OrderedDict[Any, tuple] = OrderedDict()  # rid -> (sid, tool, args, warmup)
        self.ends = 0

    # -- events ---------------------------------------------------------------------------

    def request(self, rid: Any, sid: Hashable | None, now: float, *, tool: Hashable = None,
                args: Any = None, warmup: bool = False, agent: Any = None,
                tenant: str | None = None) -> None:
        rids = self.rids
        rids[rid] = (sid, tool, args, warmup, agent, tenant)
        rids.move_to_end(rid)
        while len(rids) > self.max_requests:
            rids.popitem(last=False)
        if sid is None or warmup:
            return
        s = self._session(sid)
        if s.ended:
            self.ctl.forecast.gaps.retract_end(*self._context(s))
            s.ended = False
        if s.active == 0 and s.end_s is not None:
            if s.tool is not None:
                self.ctl.returned(sid, now)
            else:
                self.ctl.forecast.observe(now - s.end_s, NO_TOOL)
            s.end_s = None
        s.active += 1

    def finished(self, rid: Any, now: float, next_gap_s: float | None = None) -> Stall | None:
        entry = self.rids.get(rid)
        if entry is None:
            return None
        sid, tool, args, warmup, agent, tenant = entry
        if sid is None or warmup:
            return None
        s = self.sessions.get(sid)
        if s is None:
            return None
        s.active = max(0, s.active - 1)
        if s.active:
            return None
        s.end_s, s.tool, s.args = now, tool, args
        s.next_s = now + next_gap_s if next_gap_s is not None else math.inf
        if tool is None:
            return None
        return self.ctl.turn_end(sid, now, tool, args, rid=rid, agent=agent, tenant=tenant)

    def session_of(self, rid: Any) -> Hashable | None:
        e = self.rids.get(rid)
        return e[0] if e is not None else None

    def request_info(self, rid: Any) -> tuple | None:
        """(session, tool, args, warmup, agent, tenant) of a request seen recently."""
        return self.rids.get(rid)

    # -- predictions ----------------------------------------------------------------------

    def next_use_s(self, sid: Hashable, now: float) -> float | None:
        s = self.sessions.get(sid)
        if s is None:
            return None
        if s.active:
            return now
        if s.end_s is None:
            return None
        if self.oracle:
            return s.next_s
        if s.ended:
            return math.inf
        e = max(0.0, now - s.end_s)
        fc = self.ctl.forecast
        tool, cluster = self._context(s)
        hist = fc.gaps.histogram(tool, cluster)
        if hist is not None:
            end_after = self._end_after()
            if end_after is not None and e > end_after:
                s.ended = True
                self.ends += 1
                fc.gaps.observe_end(tool, cluster)
                return math.inf
            w = hist.expected_wait_fast(e)
        elif s.tool is not None:
            w = fc.predict(s.tool, s.args, e)
        else:
            return now + e
        wait = self.ctl.wait_s if self.ctl.params.queue_wait else 0.0
        return now + w + wait

    def pinned(self, key: Hashable) -> bool:
        return key in self.ctl.pins

    # -- internals ------------------------------------------------------------------------

    def _context(self, s: _Session) -> tuple[Hashable, Hashable | None]:
        if s.tool is None:
            return NO_TOOL, None
        return s.tool, self.ctl.forecast.cluster(s.tool, s.args)

    def _end_after(self) -> float | None:
        g = self.ctl.forecast.gaps.global_hist
        if g.n < self.min_gaps:
            return None
        return self.end_factor * g.quantile(0.99)

    def _session(self, sid: Hashable) -> _Session:
        s = self.sessions.get(sid)
        if s is None:
            s = self.sessions[sid] = _Session()
            while len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
        else:
            self.sessions.move_to_end(sid)
        return s
