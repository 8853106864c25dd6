from anchorage.routing.prefix_index import PrefixIndex


def test_match_len_is_longest_held_prefix():
    ix = PrefixIndex()
    ix.insert(0, [1, 2, 3, 4])
    ix.insert(1, [1, 2])
    assert ix.match([1, 2, 3, 9]) == {0: 3, 1: 2}
    assert ix.match_len(0, [1, 2, 3, 4, 5]) == 4
    assert ix.match([9, 1]) == {}
    assert ix.match_len(2, [1]) == 0


def test_capacity_evicts_chain_tail_first_keeping_the_anchor():
    ix = PrefixIndex(default_capacity_blocks=4)
    ix.insert(0, [1, 2, 3])        # anchor 1 + history 2, 3
    ix.insert(0, [1, 5, 6])        # another session on the same anchor
    assert ix.size(0) == 4
    # 3 (the older chain's tail) went first; 1 was touched again and stays
    assert ix.match_len(0, [1, 2, 3]) == 2
    assert ix.match_len(0, [1, 5, 6]) == 3


def test_remove_and_clear_update_holders():
    ix = PrefixIndex()
    ix.insert(0, [1, 2, 3])
    ix.insert(1, [1, 2, 3])
    ix.remove(0, [3, 42])
    assert ix.match([1, 2, 3]) == {0: 2, 1: 3}
    ix.clear(1)
    assert ix.match([1, 2, 3]) == {0: 2} and ix.size(1) == 0
    ix.set_capacity(0, 1)
    assert ix.size(0) == 1 and ix.match([1]) == {0: 1}
