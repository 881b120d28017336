import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from gpufeed.errors import ConfigError
from gpufeed.sampling import (
    as_even,
    derive_seed,
    epoch_order,
    gather_remainder,
    local_indices,
    rank_indices,
    real_counts,
    shard_batches,
)


@given(seed=st.integers(0, 2**40), epoch=st.integers(0, 10_000), n=st.integers(0, 3000))
def test_epoch_order_is_a_permutation_and_a_pure_function(seed, epoch, n):
    order = epoch_order(seed, epoch, n)
    assert order.dtype == torch.int64 and order.device.type == "cpu"
    assert torch.equal(order.sort().values, torch.arange(n))
    assert torch.equal(order, epoch_order(seed, epoch, n))


def test_epoch_order_differs_between_epochs_and_seeds():
    a = epoch_order(0, 0, 1000)
    assert not torch.equal(a, epoch_order(0, 1, 1000))
    assert not torch.equal(a, epoch_order(1, 0, 1000))
    # seed + epoch must not collide: (1, 0) and (0, 1) are different streams
    assert not torch.equal(epoch_order(1, 0, 1000), epoch_order(0, 1, 1000))


def test_epoch_order_without_shuffle_is_the_identity():
    assert epoch_order(5, 7, 6, shuffle=False).tolist() == [0, 1, 2, 3, 4, 5]


def test_epoch_order_does_not_touch_the_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    epoch_order(0, 0, 100)
    assert torch.equal(torch.rand(3), expected)


def test_derive_seed_is_63_bit_and_order_sensitive():
    seeds = {derive_seed(a, b, c) for a in range(8) for b in range(8) for c in range(8)}
    assert len(seeds) == 512
    assert all(0 <= s < 2**63 for s in seeds)
    assert derive_seed(1, 2) != derive_seed(2, 1)


def test_a_single_rank_gets_the_whole_order_with_only_the_tail_short_or_dropped():
    order = epoch_order(0, 0, 10)
    assert rank_indices(order, 4, 0, 1, drop_last=False, even=True).tolist() == order.tolist()
    assert rank_indices(order, 4, 0, 1, drop_last=True, even=True).tolist() == order[:8].tolist()


@given(
    n=st.integers(1, 400),
    bs=st.integers(1, 32),
    world=st.integers(1, 5),
    drop_last=st.booleans(),
    seed=st.integers(0, 100),
)
def test_evaluation_shards_visit_every_sample_exactly_once_and_differ_by_at_most_one_batch(
    n, bs, world, drop_last, seed
):
    order = epoch_order(seed, 0, n)
    shares = [rank_indices(order, bs, r, world, drop_last, even=False) for r in range(world)]
    seen = torch.cat(shares).sort().values
    used = (n // bs) * bs if drop_last else n
    assert len(seen) == used and len(seen.unique()) == used  # exactly once (all of them without drop_last)
    if not drop_last:
        assert torch.equal(seen, torch.arange(n))
    batches = [-(-len(s) // bs) for s in shares]
    assert max(batches) - min(batches) <= 1


@given(n=st.integers(1, 400), bs=st.integers(1, 32), world=st.integers(1, 5), drop_last=st.booleans())
def test_training_shards_are_equal_full_batches_with_bounded_padding(n, bs, world, drop_last):
    order = epoch_order(0, 0, n)
    shares = [rank_indices(order, bs, r, world, drop_last, even=True) for r in range(world)]
    slots, full, padded = shard_batches(n, bs, world, drop_last, even=True)
    counts = [-(-len(s) // bs) for s in shares]
    assert counts == [slots // world] * world  # same number of batches on every rank: no rank waits in a collective
    allidx = torch.cat(shares)
    if drop_last:
        assert all(len(s) % bs == 0 for s in shares)  # full batches only
        assert len(allidx.unique()) == len(allidx) and n - len(allidx) < world * bs
    else:
        assert torch.equal(allidx.unique(), torch.arange(n))  # every sample, at least once
        assert len(allidx) - n == padded < world * bs  # the stated padding bound, in samples
        sizes = [[len(b) for b in s.split(bs)] for s in shares]
        assert all(x == sizes[0] for x in sizes)  # the same shapes on every rank, batch for batch: a gather fits
        assert rank_indices(order, bs, 0, world, False, "pad").equal(shares[0])  # as even="pad" lays it out
    if world == 1:
        assert padded == 0  # one rank: nothing repeated


def test_shards_of_one_rank_are_the_whole_order_in_batches():
    order = epoch_order(3, 1, 11)
    assert torch.equal(rank_indices(order, 4, 0, 1, drop_last=False, even=False), order)


def test_rank_out_of_range_is_an_error():
    with pytest.raises(ConfigError, match="rank=2"):
        rank_indices(torch.arange(4), 2, 2, 2, drop_last=False, even=True)


@given(
    n=st.integers(1, 300), bs=st.integers(1, 16), world=st.integers(1, 4), drop_last=st.booleans(), even=st.booleans()
)
def test_local_shards_are_their_order_cut_or_padded_from_its_start_to_equal_batch_counts(n, bs, world, drop_last, even):
    assume(n >= world)  # a rank with no local sample is refused when the loader is built
    batches = []
    for r in range(world):
        local = len(range(r, n, world))
        order = epoch_order(7, r, local).tolist()  # the rank's own samples, in its order
        mine = local_indices(torch.tensor(order), bs, n, world, drop_last, even).tolist()
        if drop_last:  # full batches only: as many as the smallest share has (even), or its own
            use = (n // world) // bs if even else local // bs
            assert mine == order[: use * bs]
        elif not even:  # every sample once, in its order
            assert mine == order
        else:  # as many batches as the largest share: a short rank (no ragged tail then) repeats its order's start
            largest = -(-n // world)
            missing = -(-largest // bs) - -(-local // bs)  # its batches short of the largest share's
            assert mine == order + [order[i % local] for i in range(missing * bs)]
        batches.append(-(-len(mine) // bs))
    if even:
        assert len(set(batches)) == 1


def test_local_shards_at_small_sizes():
    # 9 samples, 2 ranks: shares of 5 and 4; batches of 4 give the first rank 2 batches, so the second repeats its 4
    assert local_indices(torch.tensor([3, 1, 2, 0]), 4, 9, 2, drop_last=False, even=True).tolist() == [3, 1, 2, 0] * 2
    assert local_indices(torch.tensor([3, 1, 2, 0]), 4, 9, 2, drop_last=False, even=False).tolist() == [3, 1, 2, 0]
    # 13 samples, 3 ranks, batches of 2: shares of 5, 4, 4; three batches each
    assert local_indices(torch.arange(4), 2, 13, 3, drop_last=False, even=True).tolist() == [0, 1, 2, 3, 0, 1]
    assert local_indices(torch.arange(5), 2, 13, 3, drop_last=False, even=True).tolist() == [0, 1, 2, 3, 4]
    # drop_last: as many full batches as the smallest share holds (4 // 2), on every rank
    assert local_indices(torch.arange(5), 2, 13, 3, drop_last=True, even=True).tolist() == [0, 1, 2, 3]
    assert local_indices(torch.arange(5), 1, 13, 3, drop_last=True, even=True).tolist() == [0, 1, 2, 3]
    assert local_indices(torch.arange(5), 1, 13, 3, drop_last=True, even=False).tolist() == [0, 1, 2, 3, 4]


@given(n=st.integers(1, 400), bs=st.integers(1, 32), world=st.integers(1, 5), seed=st.integers(0, 100))
def test_padded_evaluation_gives_equal_full_batches_and_its_real_parts_are_the_order_once(n, bs, world, seed):
    order = epoch_order(seed, 0, n)
    shares = [rank_indices(order, bs, r, world, drop_last=False, even="pad") for r in range(world)]
    counts = [real_counts(n, bs, r, world, drop_last=False, even="pad") for r in range(world)]
    batches = -(-n // (bs * world))  # rounds of one batch per rank
    if world > 1:
        assert [len(s) for s in shares] == [batches * bs] * world  # full batches, the same number on every rank
    else:
        assert torch.equal(shares[0], order)  # one rank: nothing repeated, only the last batch short
    assert [len(c) for c in counts] == [batches] * world
    # Round by round, rank after rank (the order a gather concatenates in), the real parts are the order.
    real = [s[j * bs : j * bs + cs[j]] for j in range(batches) for s, cs in zip(shares, counts, strict=True)]
    assert torch.equal(torch.cat(real), order)
    # Accelerate keeps the first `remainder` samples of the last gathered round: exactly its real ones.
    remainder = gather_remainder(n, bs, world, even="pad")
    last_round_real = sum(cs[-1] for cs in counts)
    assert last_round_real == (remainder or min(n, world * bs))
    assert all(c == bs for cs in counts for c in cs[:-1])  # repeats only in the last round


@given(
    n=st.integers(1, 300),
    bs=st.integers(1, 16),
    world=st.integers(1, 4),
    drop_last=st.booleans(),
    even=st.booleans(),
    local=st.booleans(),
)
def test_real_counts_match_the_batches_served_and_count_every_sample_once(n, bs, world, drop_last, even, local):
    assume(not local or n >= world)
    seen = []
    for r in range(world):
        if local:
            size = len(range(r, n, world))
            mine = local_indices(epoch_order(0, 0, size), bs, n, world, drop_last, even) * world + r  # global ids
        else:
            mine = rank_indices(epoch_order(0, 0, n), bs, r, world, drop_last, even)
        counts = real_counts(n, bs, r, world, drop_last, even, shard="local" if local else "full")
        assert len(counts) == -(-len(mine) // bs)
        seen += [i for j, c in enumerate(counts) for i in mine[j * bs : j * bs + c].tolist()]
    assert len(seen) == len(set(seen))  # no repeat counted
    if not drop_last:
        assert sorted(seen) == list(range(n))  # every sample counted


def test_real_counts_and_remainder_at_the_readme_sizes():
    # 2 ranks, batches of 8: 90 samples -> 6 rounds of 16 with 6 repeats; 96 -> none; 101 -> 7 rounds, 11 repeats.
    assert [real_counts(90, 8, r, 2, False, "pad") for r in range(2)] == [(8,) * 6, (8,) * 5 + (2,)]
    assert [real_counts(96, 8, r, 2, False, "pad") for r in range(2)] == [(8,) * 6, (8,) * 6]
    assert [real_counts(101, 8, r, 2, False, "pad") for r in range(2)] == [(8,) * 6 + (5,), (8,) * 6 + (0,)]
    assert [gather_remainder(n, 8, 2, "pad") for n in (90, 96, 101)] == [10, 0, 5]
    assert gather_remainder(101, 8, 2, even=False) == gather_remainder(101, 8, 2, even=True, drop_last=True) == -1
    # even=True without drop_last is laid out as "pad": equal shapes on every rank, the repeats known
    assert gather_remainder(101, 8, 2, even=True) == 5 and gather_remainder(101, 8, 1, even=True) == -1
    assert [real_counts(9, 2, r, 3, False, True) for r in range(3)] == [(2, 2), (2, 1), (2, 0)]
    assert [real_counts(9, 2, r, 3, False, True) for r in range(3)] == [real_counts(9, 2, r, 3, False, "pad")
                                                                       for r in range(3)]  # fmt: skip


def test_even_modes_are_checked_with_the_fix_in_the_message():
    assert as_even(True) is True and as_even(np.bool_(False)) is False and as_even("pad") == "pad"
    with pytest.raises(ConfigError, match=r"even='yes' must be True .*'pad' .*False"):
        as_even("yes")
    with pytest.raises(ConfigError, match=r"even='pad' .*drop_last=True.*pass drop_last=False"):
        as_even("pad", drop_last=True)
    with pytest.raises(ConfigError, match=r"even='pad' with shard='local'.*use shard='full'"):
        as_even("pad", shard="local")
