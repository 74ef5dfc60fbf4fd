"""Block manager: allocation, reference counts, prefix lookup by exact ids under a parent key, LRU eviction."""

import pytest

from backends.local_engine.engine.block_manager import BlockManager
from backends.local_engine.engine.sequence import Sequence

BS = 4


def compute_all(bm: BlockManager, seq: Sequence) -> None:
    """Admit `seq`, allocate blocks for its remaining tokens and mark them computed."""
    bm.admit(seq, bm.match_prefix(seq.token_ids))
    num_new = len(seq) - seq.num_computed_tokens
    bm.grow(seq, num_new)
    seq.num_computed_tokens += num_new
    bm.cache_full_blocks(seq)


def test_allocates_enough_blocks_and_frees_them():
    bm = BlockManager(num_blocks=8, block_size=BS)
    seq = Sequence(list(range(10)))
    compute_all(bm, seq)
    assert len(seq.block_table) == 3
    assert bm.num_free_blocks == 5
    bm.free(seq)
    assert bm.num_free_blocks == 8
    assert seq.block_table == [] and seq.num_computed_tokens == 0


def test_shared_prefix_reuses_full_blocks_and_recomputes_last_token():
    bm = BlockManager(num_blocks=16, block_size=BS)
    first = Sequence(list(range(12)))
    compute_all(bm, first)
    second = Sequence(list(range(12)) + [99, 98])
    matched = bm.match_prefix(second.token_ids)
    assert matched == first.block_table[:3]
    bm.admit(second, matched)
    assert second.num_computed_tokens == 12
    assert all(bm.blocks[b].ref_count == 2 for b in matched)
    # an identical prompt may not be served entirely from cache: its last token is recomputed
    same = Sequence(list(range(12)))
    assert len(bm.match_prefix(same.token_ids)) == 2


def test_hits_and_queries_counted_in_tokens():
    bm = BlockManager(num_blocks=16, block_size=BS)
    compute_all(bm, Sequence(list(range(9))))
    compute_all(bm, Sequence(list(range(9))))
    assert bm.stats.queries == 18
    assert bm.stats.hits == 8


def test_freed_blocks_stay_cached_until_reallocated_lru():
    bm = BlockManager(num_blocks=4, block_size=BS)
    old = Sequence(list(range(8)) + [7])
    compute_all(bm, old)
    bm.free(old)
    assert len(bm.match_prefix(old.token_ids)) == 2  # still cached after free
    filler = Sequence([50, 51, 52])  # takes one never-used block first (LRU order)
    compute_all(bm, filler)
    assert len(bm.match_prefix(old.token_ids)) == 2
    bigger = Sequence(list(range(100, 109)))  # needs 3 blocks: must evict cached ones
    bm.free(filler)
    compute_all(bm, bigger)
    assert len(bm.match_prefix(old.token_ids)) < 2


def test_lookup_depends_on_the_whole_prefix():
    bm = BlockManager(num_blocks=16, block_size=BS)
    compute_all(bm, Sequence([1, 2, 3, 4, 5, 6, 7, 8, 9]))
    assert bm.match_prefix([0, 0, 0, 0, 5, 6, 7, 8, 9]) == []


def test_a_block_is_found_by_exact_ids_under_its_own_parent():
    bm = BlockManager(num_blocks=16, block_size=BS)
    compute_all(bm, Sequence([1, 2, 3, 4, 5, 6, 7, 8, 9]))
    assert bm.match_prefix([9, 9, 9, 9, 5]) == []
    assert bm.match_prefix([1, 2, 3, 5, 5]) == []  # one id differs
    assert len(bm.match_prefix([1, 2, 3, 4, 5, 6, 7, 0, 9])) == 1  # second block differs
    assert len(bm.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0])) == 2


def test_a_reused_block_does_not_lead_to_its_old_children():
    """A block id handed out again for other ids gets a new key: the blocks cached after its old content
    (whose K/V were computed after those old ids) are not served after the new ones."""
    bm = BlockManager(num_blocks=16, block_size=BS)
    old = Sequence([1, 2, 3, 4, 5, 6, 7, 8, 9])
    compute_all(bm, old)
    head = old.block_table[0]
    bm.free(old)
    bm._free.move_to_end(head, last=False)  # the old head is the next block handed out
    new = Sequence([7, 7, 7, 7, 0])
    compute_all(bm, new)
    assert new.block_table[0] == head
    assert len(bm.match_prefix([7, 7, 7, 7, 5, 6, 7, 8, 9])) == 1
    assert bm.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 9]) == []


def test_double_free_is_detected():
    bm = BlockManager(num_blocks=4, block_size=BS)
    seq = Sequence([1, 2, 3])
    compute_all(bm, seq)
    table = list(seq.block_table)
    bm.free(seq)
    seq.block_table = table
    with pytest.raises(RuntimeError):
        bm.free(seq)


def test_prefix_caching_off_never_matches():
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_caching=False)
    compute_all(bm, Sequence(list(range(9))))
    assert bm.match_prefix(list(range(9))) == []


def test_admission_cost_counts_revived_cached_blocks():
    bm = BlockManager(num_blocks=8, block_size=BS)
    first = Sequence(list(range(9)))
    compute_all(bm, first)
    bm.free(first)
    second = Sequence(list(range(9)) + [1, 2])
    matched = bm.match_prefix(second.token_ids)
    assert len(matched) == 2
    # 2 revived cached blocks + 1 new block for tokens 8..10
    assert bm.num_new_blocks_to_admit(second, matched, 3) == 3
