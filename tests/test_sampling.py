import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gpufeed.errors import ConfigError
from gpufeed.sampling import derive_seed, epoch_order, num_batches


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


@given(n=st.integers(0, 5000), bs=st.integers(1, 600), drop_last=st.booleans())
def test_num_batches_covers_all_but_the_ragged_tail(n, bs, drop_last):
    k = num_batches(n, bs, drop_last)
    if drop_last:
        assert k * bs <= n < (k + 1) * bs
    else:
        assert (k - 1) * bs < n <= k * bs or (n == 0 and k == 0)


def test_num_batches_rejects_batch_size_below_one():
    with pytest.raises(ConfigError, match="batch_size=0"):
        num_batches(10, 0, False)
