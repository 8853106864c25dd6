"""ThunderAgent's capacity scheduler: the capacity formula, the pause order, resume."""

import pytest

from anchorage.routing.thunderagent import ACTING, REASONING, ThunderAgentScheduler


def test_remaining_capacity_formula():
    s = ThunderAgentScheduler([10_000], acting_weight=0.5)
    assert s.arrive("a", 2000, 0.0) == 0
    assert s.arrive("b", 1000, 0.0) == 0
    s.finished("b", 1200, 1.0)             # b acts (tool call) with 1,200 tokens
    # used = reasoning 2000 + 0.5 * acting 1200 - shared 0 + 100 * 2 programs
    assert s.remaining(0) == pytest.approx(10_000 - (2000 + 600 + 200))
    s.check(2.0, held_tokens=[1500])       # the engine holds 1,500: shared = 2000 - 1500
    assert s.backends[0].shared == 500
    assert s.remaining(0) == pytest.approx(10_000 - (2000 + 600 - 500 + 200))


def test_new_program_goes_to_least_active_backend_with_room_or_waits():
    s = ThunderAgentScheduler([5000, 5000])
    assert s.arrive("a", 3000, 0.0) == 0
    assert s.arrive("b", 1000, 0.0) == 1   # fewer active tokens on 1
    assert s.arrive("c", 4500, 0.0) is None  # room for 4,500 + 100 on neither: it waits
    assert s.arrive("d", 100, 0.0) is None   # a program is paused: newcomers queue behind


def test_over_capacity_pauses_acting_smallest_first_then_marks_reasoning():
    s = ThunderAgentScheduler([10_000])
    for pid, tok in (("big", 4000), ("small", 1000), ("mid", 2000)):
        assert s.arrive(pid, tok, 0.0) == 0
    s.finished("big", 4000, 1.0)
    s.finished("small", 1000, 1.0)
    for p in ("big", "small", "mid"):
        s.programs[p].tokens *= 3          # contexts grew: 21,000 tokens, over capacity
    s.check(5.0, held_tokens=[0])
    # acting programs pause smallest first (small, then big: 6,100 used), and the
    # best-fit resume of the same check puts small (3,000 + 100 <= 3,900) back
    assert s.pauses == 2 and s.resumes == 1
    assert s.programs["big"].paused and not s.programs["small"].paused
    assert not s.programs["mid"].marked
    # only reasoning programs over capacity: they are marked, smallest first, and pause
    # when their turn ends
    t = ThunderAgentScheduler([5000])
    for pid in ("p", "q"):
        t.arrive(pid, 1000, 0.0)
    t.programs["p"].tokens, t.programs["q"].tokens = 3000, 2500
    t.check(1.0, held_tokens=[5500])
    assert t.programs["q"].marked and not t.programs["p"].marked
    assert t.backends[0].future_paused == 2500
    t.finished("q", 2600, 2.0)
    assert t.programs["q"].paused
    assert t.arrive("q", 2600, 3.0) is None  # its next request waits for resume


def test_resume_best_fit_decreasing_and_waiting_requests_first():
    s = ThunderAgentScheduler([10_000])
    for pid in ("x", "y"):
        s.arrive(pid, 1000, 0.0)
        s.finished(pid, 1000, 0.0)
    s.programs["x"].tokens = s.programs["y"].tokens = 6000
    s.check(1.0, held_tokens=[0])          # 12,200 used: y (tie: name order) goes first
    paused = [p for p in ("x", "y") if s.programs[p].paused]
    assert len(paused) == 1
    p = paused[0]
    assert s.arrive(p, 6000, 2.0) is None
    s.release("x" if p == "y" else "y")    # the other session ends: room for 6,100
    resumed = s.check(3.0, held_tokens=[0])
    assert resumed == [(p, 0)]
    assert s.programs[p].status == REASONING
    assert s.arrive(p, 6000, 4.0) == 0


def test_programs_paused_too_long_are_forced_back():
    s = ThunderAgentScheduler([1000], timeout_s=10.0)
    assert s.arrive("a", 800, 0.0) == 0
    assert s.arrive("b", 800, 0.0) is None
    assert s.check(5.0, [0]) == []
    assert s.check(11.0, [0]) == [("b", 0)]
    assert s.programs["b"].status == REASONING
    assert ACTING != REASONING
