"""Draws keyed per sample (``KeyedDraws``): a sample's augmentation is a function of (seed, epoch, id) alone, so it
comes out the same whichever batch, position, batch size or rank serves it; the keyed draws are uniform and
independent, and each op's parameters are distributed as with a ``torch.Generator``."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torchvision.transforms as T

from gpufeed.augment import (
    AugMix,
    AutoAugment,
    ColorJitter,
    Compose,
    Cutout,
    GaussianBlur,
    KeyedDraws,
    Normalize,
    RandAugment,
    RandomAdjustSharpness,
    RandomAffine,
    RandomApply,
    RandomAutocontrast,
    RandomChoice,
    RandomCrop,
    RandomEqualize,
    RandomErasing,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomInvert,
    RandomOrder,
    RandomPerspective,
    RandomPosterize,
    RandomResizedCrop,
    RandomRotation,
    RandomSolarize,
    RandomVerticalFlip,
    TrivialAugmentWide,
    keyed,
)
from gpufeed.augment.params import rand
from gpufeed.augment.timm_auto import Hparams, TimmAutoAugment, TimmOp, TimmRandAugment
from gpufeed.augment.timm_ops import TimmRandomErasing
from gpufeed.errors import ConfigError, DeviceError
from gpufeed.pipeline.translate import build_batched, split_transform
from gpufeed.read.samples import to_chw
from gpufeed.store.ragged import Ragged

from stats import ALPHA, chi_square_p_value, ks_critical, ks_statistic

SEED, EPOCH = 11, 3
N = 10  # samples per batch in the invariance tests; ids are 100 + position, so no id equals a position


def _images(n: int = N, h: int = 18, w: int = 22, seed: int = 0, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    x = torch.randint(0, 256, (n, 3, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    return x if dtype == torch.uint8 else x.to(dtype) / 255


def _draws(ids, epoch: int = EPOCH, seed: int = SEED, device: str | torch.device = "cpu") -> KeyedDraws:
    return KeyedDraws(seed, epoch, torch.as_tensor(ids, dtype=torch.int64, device=device))


def _served_elsewhere(op, x: torch.Tensor, ids: torch.Tensor, other: torch.Tensor) -> None:
    """``op`` on the batch, keyed by ``ids``; then each of these ways of serving some of its samples gives them
    the same output, bit for bit: a reversed subset, a batch of one, the samples among other companions (``other``,
    with ids of their own) at other positions, and a larger batch of repeats."""
    whole = op(x, generator=_draws(ids))
    n = len(ids)
    other_ids = 1000 + torch.arange(len(other))
    ways = {
        "reversed subset": torch.tensor([n - 1, 4, 1]),
        "batch of one": torch.tensor([3]),
        "every other": torch.arange(0, n, 2),
    }
    for name, idx in ways.items():
        part = op(_take(x, idx), generator=_draws(ids[idx]))
        assert torch.equal(part, whole[idx]), name
    mixed_x = _cat(_take(other, torch.arange(2)), _take(x, torch.tensor([2, 7])), _take(other, torch.arange(2, 4)))
    mixed_ids = torch.cat([other_ids[:2], ids[torch.tensor([2, 7])], other_ids[2:4]])
    mixed = op(mixed_x, generator=_draws(mixed_ids))
    assert torch.equal(mixed[2:4], whole[torch.tensor([2, 7])]), "among other companions"
    big = torch.tensor([5, 5, 0, 9, 5, 0])  # a larger batch, a sample served twice draws twice the same
    assert torch.equal(op(_take(x, big), generator=_draws(ids[big])), whole[big]), "repeats"


def _take(x, idx: torch.Tensor):
    return x.select(idx) if isinstance(x, Ragged) else x[idx]


def _cat(*parts):
    if isinstance(parts[0], Ragged):
        return Ragged.stack([p.image(i) for p in parts for i in range(len(p))])
    return torch.cat(parts)


IDS = 100 + torch.arange(N)

U8 = torch.uint8
F32 = torch.float32
TIMM = Hparams.make((124, 116, 104), ("bilinear", "bicubic"), 5, 0.45)
TIMM_OPS = tuple(TimmOp(name, 0.7, 9.0, 0.5) for name in ("Rotate", "ShearX", "Solarize", "Color", "Posterize"))
OPS = {  # every batched random op, with the input dtype it takes
    "RandomCrop reflect": (RandomCrop(16, padding=3, padding_mode="reflect"), U8),
    "RandomCrop pad_if_needed": (RandomCrop(24, pad_if_needed=True, fill=7), U8),
    "RandomHorizontalFlip": (RandomHorizontalFlip(), U8),
    "RandomVerticalFlip": (RandomVerticalFlip(0.3), U8),
    "RandomResizedCrop float": (RandomResizedCrop(12), U8),
    "RandomResizedCrop v2 bicubic": (RandomResizedCrop(14, interpolation="bicubic", kernel="torch"), U8),
    "RandomResizedCrop pil, random interpolation": (
        RandomResizedCrop(12, interpolation=("bilinear", "bicubic"), kernel="pil"),
        U8,
    ),
    "ColorJitter": (ColorJitter(0.4, 0.4, 0.4, 0.1), U8),
    "ColorJitter float": (ColorJitter(0.4, 0.3, 0.2, 0.1), F32),
    "RandomErasing": (RandomErasing(p=0.7), U8),
    "RandomErasing random value": (RandomErasing(p=0.9, value="random"), F32),
    "Cutout": (Cutout(6, p=0.8), U8),
    "RandomRotation": (RandomRotation(30, interpolation="bilinear", fill=(1.0, 2.0, 3.0)), U8),
    "RandomRotation pil": (RandomRotation(20, pil=True), U8),
    "RandomAffine": (RandomAffine(15, (0.1, 0.2), (0.8, 1.2), (-5, 5, -3, 3)), U8),
    "RandomAffine pil v2": (RandomAffine(10, (0.1, 0.1), (0.9, 1.1), 4, "bilinear", pil=True, v2=True), U8),
    "RandomPerspective": (RandomPerspective(0.5, p=0.7), U8),
    "GaussianBlur": (GaussianBlur(5, (0.1, 2.0)), U8),
    "RandomSolarize": (RandomSolarize(100), U8),
    "RandomPosterize": (RandomPosterize(3), U8),
    "RandomAutocontrast": (RandomAutocontrast(), U8),
    "RandomEqualize": (RandomEqualize(), U8),
    "RandomAdjustSharpness": (RandomAdjustSharpness(2.0), U8),
    "RandomInvert": (RandomInvert(), U8),
    "RandomGrayscale": (RandomGrayscale(0.4), U8),
    "RandomApply": (RandomApply((ColorJitter(0.4, 0.4, 0.4, 0.1), RandomHorizontalFlip()), p=0.6), U8),
    "RandomChoice": (RandomChoice((RandomInvert(1.0), GaussianBlur(3), RandomSolarize(90, 1.0)), (1, 2, 1)), U8),
    "RandomOrder": (RandomOrder((RandomPosterize(4), RandomAdjustSharpness(2.0), RandomRotation(10))), U8),
    "nested containers": (
        RandomApply((RandomChoice((RandomApply((RandomInvert(1.0),), 0.5), ColorJitter(0.3))),), 0.7),
        U8,
    ),
    "TrivialAugmentWide": (TrivialAugmentWide(), U8),
    "TrivialAugmentWide pil": (TrivialAugmentWide(interpolation="bilinear", pil=True), U8),
    "RandAugment": (RandAugment(num_ops=3, magnitude=12), U8),
    "AutoAugment": (AutoAugment("imagenet"), U8),
    "AutoAugment svhn": (AutoAugment("svhn", interpolation="bilinear"), U8),
    "AugMix": (AugMix(), U8),
    "AugMix depth 2": (AugMix(severity=5, mixture_width=2, chain_depth=2, alpha=0.5, all_ops=False), U8),
    "TimmRandAugment": (TimmRandAugment(TIMM_OPS, num_layers=2, hparams=TIMM), U8),
    "TimmRandAugment weighted": (TimmRandAugment(TIMM_OPS, 3, (0.1, 0.4, 0.2, 0.0, 0.3), TIMM), U8),
    "TimmAutoAugment": (TimmAutoAugment(TIMM_OPS, ((0, 2), (1,), (3, 4, 0)), TIMM), U8),
    "TimmRandomErasing pixel": (TimmRandomErasing(0.8, mode="pixel", max_count=2), F32),
    "TimmRandomErasing rand": (TimmRandomErasing(0.8, mode="rand"), F32),
    "Compose": (
        Compose([RandomResizedCrop(16), RandomHorizontalFlip(), RandomCrop(14, padding=2), Normalize([0.5], [0.2])]),
        U8,
    ),
}


@pytest.mark.parametrize("name", list(OPS))
def test_every_op_gives_a_sample_the_same_output_in_any_batch(name):
    op, dtype = OPS[name]
    _served_elsewhere(op, _images(dtype=dtype), IDS, _images(4, seed=1, dtype=dtype))


def _recipe_zoo() -> dict:
    from test_random_ops import SSL

    from test_recipes import ACCEPTED, reference_train

    deterministic = ("reference eval v1 pil", "reference eval v2 tensor", "weights preset (ImageClassification)")
    zoo = {name: transform for name, (transform, _) in ACCEPTED.items() if name not in deterministic}
    zoo.update({f"SSL {name}": T.Compose([T.PILToTensor(), *ops(T)]) for name, ops in SSL.items()})
    for policy in ("ra", "ta_wide", "augmix", "imagenet"):
        zoo[f"reference train, {policy}"] = reference_train(16, policy=policy, erase=0.5)
    return zoo


ZOO = _recipe_zoo()


@pytest.mark.parametrize("name", list(ZOO))
def test_every_translated_recipe_gives_a_sample_the_same_output_in_any_batch(name):
    from PIL import Image

    images = [Image.fromarray(a.permute(1, 2, 0).numpy()) for a in _images(N + 4, 32, 40, seed=2)]
    split = split_transform(ZOO[name])
    cached = split.cached_transform()
    outs = [cached(img) if cached else img for img in images]
    stored = torch.stack([to_chw(out) for out in outs])
    ops = build_batched(split.device, stored.dtype, tuple(stored.shape[2:]), pil=isinstance(outs[0], Image.Image))
    assert ops is not None and ops.random, name
    _served_elsewhere(ops, stored[:N], IDS, stored[N:])


def _ragged(n: int, seed: int) -> Ragged:
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(12, 60, (n, 2), generator=g).tolist()
    return Ragged.stack([torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in sizes])


@pytest.mark.parametrize(
    "op",
    [
        RandomResizedCrop(16),
        RandomResizedCrop(16, interpolation=("bilinear", "bicubic"), kernel="torch"),
        Compose([RandomResizedCrop(20), RandomHorizontalFlip(), TrivialAugmentWide(), Normalize([0.5], [0.2])]),
    ],
    ids=["RandomResizedCrop", "random interpolation", "ImageNet recipe with TrivialAugmentWide"],
)
def test_images_of_different_sizes_draw_by_their_own_ids(op):
    _served_elsewhere(op, _ragged(N, 0), IDS, _ragged(4, 1))


def test_the_same_seed_epoch_and_id_draw_the_same_and_any_other_key_draws_anew():
    op = RandomResizedCrop(12)
    x = _images(64, 40, 40)
    ids = torch.arange(64) * 7919  # spread ids, past a batch's positions

    def boxes(draws: KeyedDraws) -> torch.Tensor:
        p = op.sample(x, draws)
        return torch.stack([p["top"], p["left"], p["height"], p["width"]], 1)

    first = boxes(_draws(ids))
    assert torch.equal(boxes(_draws(ids)), first)  # a second call, a fresh KeyedDraws: the same draws
    for other in (_draws(ids, epoch=EPOCH + 1), _draws(ids, seed=SEED + 1), _draws(ids + 1)):
        same = (boxes(other) == first).all(1)
        assert int(same.sum()) <= 2  # a box repeats by chance now and then (many fall back to the whole image)
    u = _draws(torch.arange(4096)).uniform((4096,))
    assert u.unique().numel() >= 4096 - 2  # different ids: different draws (24-bit values, birthday ~0.5)


def test_one_draws_object_advances_like_a_generator_and_its_children_are_pure():
    d = _draws(IDS)
    a, b = d.uniform((N,)), d.uniform((N,))
    assert not torch.equal(a, b)  # the counter moved
    assert torch.equal(_draws(IDS).uniform((N,)), a)
    assert torch.equal(d.child(2).uniform((N,)), _draws(IDS).child(2).uniform((N,)))  # whatever the parent drew
    assert not torch.equal(d.child(2).uniform((N,)), d.child(3).uniform((N,)))
    assert not torch.equal(d.child("inner").uniform((N,)), d.child(("inner",)).uniform((N,)))
    picked = torch.tensor([7, 2])
    assert torch.equal(_draws(IDS).select(picked).uniform((2,)), a[picked])
    with pytest.raises(ConfigError, match="label=1.5"):
        d.child(1.5)  # type: ignore[arg-type]


def test_a_pipeline_or_a_container_called_twice_with_one_draws_object_draws_anew_each_time():
    # two views of a batch from one KeyedDraws (a contrastive recipe): different, as with a generator; the same
    # calls from a fresh object repeat them exactly
    x = torch.randint(0, 256, (N, 3, 16, 16), dtype=torch.uint8)
    recipes = [
        Compose([RandomResizedCrop(8), RandomHorizontalFlip()]),
        RandomApply([ColorJitter(0.4, 0.4, 0.4)], p=1.0),
    ]
    for aug in recipes:
        d = _draws(IDS)
        first, second = aug(x, generator=d), aug(x, generator=d)
        assert not torch.equal(first, second), aug
        again = _draws(IDS)
        assert torch.equal(aug(x, generator=again), first) and torch.equal(aug(x, generator=again), second)


def test_an_op_that_draws_differently_or_applies_to_no_sample_leaves_the_next_ops_draws_alone():
    x = _images()
    crop = RandomCrop(14, padding=3)
    # both first ops leave every image as it is, but draw different amounts
    a = Compose([RandomErasing(p=0.0), crop])
    b = Compose([RandomInvert(p=0.0), crop])
    assert torch.equal(a(x, generator=_draws(IDS)), b(x, generator=_draws(IDS)))
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    assert not torch.equal(a(x, generator=g()), b(x, generator=g()))  # one stream: the crop's draws moved


def test_a_rejection_loop_does_not_move_the_draws_after_it():
    from gpufeed.augment.auto import dirichlet

    alpha = torch.tensor([0.3, 0.5, 2.0])
    alone = dirichlet(alpha, 1, _draws([5]))
    crowd = dirichlet(alpha, 64, _draws(torch.arange(64)))  # more samples: more rounds of the loop
    assert torch.equal(crowd[5:6], alone)


def test_bad_keyed_draws_are_refused_with_the_fix():
    x = _images()
    with pytest.raises(ConfigError, match="holds 3 ids for a batch of 10"):
        RandomHorizontalFlip()(x, generator=_draws([1, 2, 3]))
    with pytest.raises(ConfigError, match="1-D int64"):
        KeyedDraws(0, 0, torch.arange(4, dtype=torch.int32))
    with pytest.raises(ConfigError, match="axis 0"):
        rand(_draws([1, 2]), (3,), torch.device("cpu"))


def test_a_rank_sees_the_same_augmented_sample_whatever_the_world_size():
    # a global batch of 12 served by 1, 2 or 4 ranks (rank r takes every world-th sample): each sample the same
    op = Compose([RandomResizedCrop(12), RandomHorizontalFlip(), ColorJitter(0.4, 0.4, 0.4, 0.1), RandomErasing()])
    x, ids = _images(12), torch.arange(500, 512)
    single = op(x, generator=_draws(ids))
    for world in (2, 4):
        for rank in range(world):
            share = torch.arange(rank, 12, world)
            assert torch.equal(op(x[share], generator=_draws(ids[share])), single[share]), (world, rank)


# -- the draws themselves -------------------------------------------------------------------------------------

DRAWS = 100_000  # a stated significance of ALPHA = 1e-3 (tests/stats.py), fixed keys: the tests cannot flake


def test_keyed_uniforms_pass_uniformity_and_independence_checks():
    d = _draws(torch.arange(DRAWS))
    u = d.uniform((DRAWS, 2))
    for column in u.unbind(1):
        # one-sample KS against U(0, 1): the largest distance of the empirical CDF from the line
        s = column.double().sort().values
        k = torch.arange(1, DRAWS + 1, dtype=torch.float64) / DRAWS
        stat = float(torch.maximum(k - s, s - (k - 1 / DRAWS)).max())
        assert stat < math.sqrt(-0.5 * math.log(ALPHA / 2) / DRAWS)
        assert chi_square_p_value(torch.histc(column, 256, 0, 1)) > ALPHA
    # pairs of elements, of consecutive ids and of two streams: uniform over a 16 x 16 grid
    nxt = d.uniform((DRAWS,))
    pairs = [(u[:, 0], u[:, 1]), (u[:-1, 0], u[1:, 0]), (u[:, 0], nxt), (u[:, 0], d.child(1).uniform((DRAWS,)))]
    for a, b in pairs:
        cells = (a * 16).long() * 16 + (b * 16).long()
        assert chi_square_p_value(torch.bincount(cells, minlength=256)) > ALPHA
    assert float(u.max()) < 1.0 and float(u.min()) >= 0.0


def test_keyed_integers_normals_permutations_and_choices_follow_their_distributions():
    d = _draws(torch.arange(DRAWS))
    assert chi_square_p_value(torch.bincount(d.integers(3, 10, (DRAWS,)) - 3, minlength=7)) > ALPHA
    z = d.normal((DRAWS,), torch.float64)
    s = z.sort().values
    cdf = 0.5 * (1 + torch.erf(s / math.sqrt(2)))
    k = torch.arange(1, DRAWS + 1, dtype=torch.float64) / DRAWS
    assert float(torch.maximum(k - cdf, cdf - (k - 1 / DRAWS)).max()) < math.sqrt(-0.5 * math.log(ALPHA / 2) / DRAWS)
    perms = {p: i for i, p in enumerate(itertools.permutations(range(4)))}
    codes = torch.tensor([perms[tuple(p)] for p in d.permutation(4)[:24_000].tolist()])
    assert chi_square_p_value(torch.bincount(codes, minlength=24)) > ALPHA
    weights = (1.0, 0.0, 3.0, 4.0)
    picks = d.categorical(weights)
    expected = torch.tensor(weights, dtype=torch.float64) / sum(weights) * DRAWS
    counts = torch.bincount(picks, minlength=4).double()
    assert counts[1] == 0
    stat = float(((counts - expected)[expected > 0] ** 2 / expected[expected > 0]).sum())
    assert 1 - float(torch.distributions.Chi2(2).cdf(torch.tensor(stat))) > ALPHA
    firsts = d.without_replacement(weights, 2)
    assert bool((firsts[:, 0] != firsts[:, 1]).all()) and not bool((firsts == 1).any())
    counts = torch.bincount(firsts[:, 0], minlength=4).double()  # the first pick: proportional to the weights
    stat = float(((counts - expected)[expected > 0] ** 2 / expected[expected > 0]).sum())
    assert 1 - float(torch.distributions.Chi2(2).cdf(torch.tensor(stat))) > ALPHA


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_keyed_draws_are_the_same_on_the_cpu_and_on_cuda():
    ids = torch.arange(5000) * 31 + 2**40  # ids past 2**32 too

    def draws(device: str) -> list[torch.Tensor]:
        d = _draws(ids, device=device)
        return [
            d.uniform((5000, 3)),
            d.uniform((2, 5000), torch.float64, axis=1),
            d.integers(-4, 250, (5000, 2)),
            d.permutation(6),
            d.categorical((0.2, 0.0, 0.5, 0.3)),
            d.child("x").select(torch.arange(0, 5000, 3, device=device)).uniform((1667,)),
        ]

    for a, b in zip(draws("cpu"), draws("cuda"), strict=True):
        assert torch.equal(a, b.cpu())
    for dtype, atol in ((torch.float32, 1e-5), (torch.float64, 1e-12)):  # log, cos, sin: the last bits may differ
        z_cpu, z_cuda = (_draws(ids, device=d).normal((5000, 4), dtype) for d in ("cpu", "cuda"))
        assert torch.allclose(z_cpu, z_cuda.cpu(), rtol=0, atol=atol)
    op = Compose([RandomCrop(14, padding=2), RandomHorizontalFlip(), RandomErasing(p=0.7)])
    x = _images(64)
    on_cpu = op(x, generator=_draws(ids[:64]))
    on_cuda = op(x.cuda(), generator=_draws(ids[:64], device="cuda"))
    assert torch.equal(on_cpu, on_cuda.cpu())  # integer-exact ops: the same pixels
    with pytest.raises(DeviceError, match="ids are on 'cpu' but the batch is on 'cuda:0'"):
        op(x.cuda(), generator=_draws(ids[:64]))


# -- each op's parameters, keyed and from a generator: the same distributions (the harness of the torchvision tests)

PARAMS = 20_000


def _both(op, x: torch.Tensor) -> tuple[dict, dict]:
    return op.sample(x, _draws(torch.arange(len(x)))), op.sample(x, torch.Generator().manual_seed(0))


def _same_distribution(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert ks_statistic(a, b) < ks_critical(len(a), len(b)), what


def test_random_resized_crop_boxes_are_distributed_as_with_a_generator():
    keyed, drawn = _both(RandomResizedCrop(24), torch.zeros(PARAMS, 3, 40, 30))
    for key in ("top", "left", "height", "width"):
        _same_distribution(keyed[key], drawn[key], key)
    _same_distribution(keyed["height"] * keyed["width"], drawn["height"] * drawn["width"], "area")


def test_color_jitter_orders_and_factors_are_distributed_as_with_a_generator():
    keyed, drawn = _both(ColorJitter(0.4, 0.3, 0.2, 0.1), torch.zeros(PARAMS, 3, 2, 2))
    perms = {p: i for i, p in enumerate(itertools.permutations(range(4)))}
    codes = torch.tensor([perms[tuple(p)] for p in keyed["order"].tolist()])
    assert chi_square_p_value(torch.bincount(codes, minlength=24)) > ALPHA
    for j in range(4):
        _same_distribution(keyed["factors"][j], drawn["factors"][j], f"factor {j}")


def test_trivial_augment_ops_and_magnitudes_are_distributed_as_with_a_generator():
    keyed, drawn = _both(TrivialAugmentWide(), torch.zeros(PARAMS, 3, 8, 8, dtype=torch.uint8))
    assert chi_square_p_value(torch.bincount(keyed["op"], minlength=14)) > ALPHA
    _same_distribution(keyed["magnitude"], drawn["magnitude"], "magnitude")
    rotate = keyed["op"] == 5
    negative = float((keyed["magnitude"][rotate] < 0).double().mean())
    assert abs(negative - 0.5 * 30 / 31) < 3.3 * (0.25 / int(rotate.sum())) ** 0.5  # bin 0 has no sign


def test_random_erasing_boxes_are_distributed_as_with_a_generator():
    keyed, drawn = _both(RandomErasing(p=0.5), torch.zeros(PARAMS, 3, 32, 32))
    rate = float(keyed["mask"].double().mean())
    assert abs(rate - float(drawn["mask"].double().mean())) < 4.5 * math.sqrt(2 * 0.25 / PARAMS)
    a, b = keyed["mask"], drawn["mask"]
    for key in ("top", "left", "height", "width"):
        _same_distribution(keyed[key][a], drawn[key][b], key)


def test_normals_made_a_piece_of_columns_at_a_time_equal_the_whole_draw_bit_for_bit(monkeypatch):
    # per-pixel noise of a large batch is made in pieces (bounded temporaries); the pieces must not show
    ids = torch.arange(5, dtype=torch.int64) * 1009
    whole = KeyedDraws(2, 1, ids).normal((5, 3, 7, 9))
    monkeypatch.setattr(keyed, "_NORMAL_PIECE", 7)  # 1 column per piece for 5 samples
    pieces = KeyedDraws(2, 1, ids).normal((5, 3, 7, 9))
    assert torch.equal(whole, pieces) and whole.shape == (5, 3, 7, 9)
    assert abs(float(whole.mean())) < 0.1 and abs(float(whole.std()) - 1) < 0.1


def test_two_samples_whose_first_32_bit_lanes_collide_still_draw_apart():
    # NOTE [ 64 bits per sample ]: ids below 2**32 map to distinct lanes (the mix is a bijection); among 300,000
    # 62-bit ids (a stream's global sample ids, a hash of a key) two share a 32-bit lane (birthday bound: ~10
    # pairs), and with one lane they would draw the same parameters every draw of the epoch
    from gpufeed.augment.keyed import _base
    from gpufeed.sampling import derive_seed

    ids = torch.randint(0, 2**62, (300_000,), generator=torch.Generator().manual_seed(0))
    lanes = _base(derive_seed(0x524F4F54, 0, 0), ids)  # KeyedDraws(seed=0, epoch=0)'s root
    first = lanes[0]
    order = torch.argsort(first, stable=True)
    same = (first[order][1:] == first[order][:-1]).nonzero().flatten()
    assert len(same) > 0  # a collision of the first lane exists among these ids
    a, b = int(order[same[0]]), int(order[same[0] + 1])
    assert lanes[1][a] != lanes[1][b]  # the second lane tells them apart
    draws = KeyedDraws(0, 0, torch.tensor([a, b])).uniform((2, 64))
    assert not torch.equal(draws[0], draws[1])
