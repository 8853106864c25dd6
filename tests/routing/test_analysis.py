import pytest

from anchorage.routing.analysis import miss_decomposition


def test_each_missed_block_is_compulsory_placement_or_capacity():
    anchor = ["A0", "A1"]
    reqs = [
        (anchor + ["s1a"], 0, 0, "s1"),            # all new: 3 compulsory
        (anchor + ["s2a"], 1, 0, "s2"),            # anchor only on replica 0: 2 placement
        (anchor + ["s1a", "s1b"], 0, 1, "s1"),     # held 3 there, hit 1: 2 capacity, 1 new
        (anchor + ["s1a", "s1b", "s1c"], 1, 2, "s1"),  # replica 1 held the anchor (hit 2),
    ]                                              # s1a/s1b only on 0: 2 placement, 1 new
    d = miss_decomposition(reqs)
    assert d["prompt_blocks"] == 15
    assert d["hit"] == pytest.approx(3 / 15)
    assert d["compulsory"] == pytest.approx(6 / 15)
    assert d["placement"] == pytest.approx(4 / 15)
    assert d["capacity"] == pytest.approx(2 / 15)
    assert d["hit"] + d["compulsory"] + d["placement"] + d["capacity"] == pytest.approx(1)
    # shared blocks: the anchor (two sessions) -> 2 of the placement misses, 1 capacity miss
    assert d["anchor_placement"] == pytest.approx(2 / 15)
    assert d["anchor_capacity"] == pytest.approx(1 / 15)
    assert (d["threads"], d["thread_moves"]) == (2, 1)   # s1 continued twice, moved once


def test_one_shared_cache_has_no_placement_loss_and_hits_are_clipped():
    # 9 hits counted (preempted attempts): clipped to the 2 blocks anyone held before
    reqs = [(["a", "b"], 0, 0, "x"), (["a", "b", "c"], 0, 9, "y")]
    d = miss_decomposition(reqs)
    assert d["placement"] == 0 and d["capacity"] == 0
    assert d["hit"] == pytest.approx(2 / 5) and d["compulsory"] == pytest.approx(3 / 5)
    assert miss_decomposition([])["prompt_blocks"] == 0
