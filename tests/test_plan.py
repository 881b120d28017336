"""The planner's batched part equals the original torchvision pipeline, sample by sample, given the same parameters."""

import copy

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from PIL import Image

import gpufeed as gf
from gpufeed import augment as A
from gpufeed.errors import ConfigError, UnsupportedTransformError
from gpufeed.pipeline.translate import build_batched, flatten, split_transform
from gpufeed.read.samples import to_chw

from fakes import cifar_like

M, S = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)

PIPELINES = {
    "cifar v1": T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(M, S)]),
    "resize prefix, erasing v1": T.Compose(
        [
            T.Resize(40),
            T.CenterCrop(36),
            T.RandomCrop(32),
            T.RandomVerticalFlip(0.3),
            T.ToTensor(),
            T.Normalize(M, S),
            T.RandomErasing(p=0.7, value=0.5),
        ]
    ),
    "to tensor first, reflect, random erase v1": T.Compose(
        [
            T.ToTensor(),
            T.RandomCrop(32, padding=2, padding_mode="reflect"),
            T.Normalize(M, S),
            T.RandomErasing(p=0.9, value="random"),
        ]
    ),
    "v2 pad_if_needed reflect": v2.Compose(
        [
            v2.ToImage(),
            v2.RandomCrop(40, padding=[1, 2], pad_if_needed=True, padding_mode="reflect"),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(M, S),
            v2.RandomErasing(p=0.8, value=(0.1, 0.2, 0.3)),
        ]
    ),
    "v2 uint8 erasing, fill tuple": v2.Compose(
        [
            v2.PILToTensor(),
            v2.RandomCrop(32, padding=3, fill=(10, 20, 30)),
            v2.RandomErasing(p=1.0, value=7),
            v2.ToDtype(torch.float32, scale=True),
        ]
    ),
    "grayscale prefix": T.Compose([T.Grayscale(), T.RandomCrop(32, padding=4, fill=128), T.ToTensor()]),
    "nested compose": T.Compose([T.Compose([T.RandomCrop(32, padding=1)]), T.Compose([T.ToTensor()])]),
}


def _pin(op, params, i):
    """A copy of the torchvision random op ``op`` that uses sample ``i`` of gpufeed's ``params``."""
    op = copy.deepcopy(op)
    name, is_v2 = type(op).__name__, type(op).__module__.startswith("torchvision.transforms.v2")
    if name == "RandomCrop":
        top, left = int(params["top"][i]), int(params["left"][i])
        if is_v2:
            make = type(op).make_params
            op.make_params = lambda flat: {**make(op, flat), "top": top, "left": left, "needs_crop": True}
        else:
            op.get_params = lambda img, size: (top, left, *size)
    elif name in ("RandomHorizontalFlip", "RandomVerticalFlip"):
        op.p = 1.0 if params["mask"][i] else 0.0
    elif name == "RandomErasing":
        op.p = 1.0 if params["mask"][i] else 0.0
        box = [int(params[k][i]) for k in ("top", "left", "height", "width")]
        value = params["value"]
        v = value[i, :, box[0] : box[0] + box[2], box[1] : box[1] + box[3]] if value.shape[0] > 1 else value[0]
        if is_v2:
            op.make_params = lambda flat: dict(i=box[0], j=box[1], h=box[2], w=box[3], v=v)
        else:
            op.get_params = lambda img, scale, ratio, value: (*box, v)
    return op


@pytest.mark.parametrize("name", list(PIPELINES))
def test_batched_part_equals_the_torchvision_pipeline_with_the_same_parameters(name):
    transform = PIPELINES[name]
    images = [Image.fromarray(a) for a in torch.randint(0, 256, (12, 32, 32, 3), dtype=torch.uint8).numpy()]
    split = split_transform(transform)
    cached = split.cached_transform()
    stored = torch.stack([to_chw(cached(img) if cached else img) for img in images])
    batched = build_batched(split.device, stored.dtype, tuple(stored.shape[2:]))
    g = torch.Generator().manual_seed(0)
    x, drawn = stored, []
    for op in batched.transforms:  # one by one, keeping each random op's parameters
        params = op.sample(x, g) if op.random else {}
        drawn.append(params) if op.random else None
        x = op.apply(x, params)
    random_ops = [op for op in split.device if type(op).__name__.startswith("Random")]
    assert len(random_ops) == len(drawn)
    for i, img in enumerate(images):
        ops = list(split.cached) + [
            _pin(op, drawn[random_ops.index(op)], i) if op in random_ops else op for op in split.device
        ]
        expected = ops[0] if len(ops) == 1 else type(transform)(ops)
        with torch.random.fork_rng():
            out = expected(img)
        assert torch.equal(x[i], to_chw(out)), (name, i)


def test_cifar_pipeline_runs_entirely_on_the_device_from_uint8():
    split = split_transform(PIPELINES["cifar v1"])
    assert split.cached == ()
    batched = build_batched(split.device, torch.uint8, (32, 32))
    assert [type(t).__name__ for t in batched.transforms] == ["RandomCrop", "RandomHorizontalFlip", "Normalize"]


def test_deterministic_prefix_is_cached_and_conversions_move_to_the_device():
    split = split_transform(PIPELINES["resize prefix, erasing v1"])
    assert [type(op).__name__ for op in split.cached] == ["Resize", "CenterCrop"]
    assert [type(op).__name__ for op in split.device][:2] == ["RandomCrop", "RandomVerticalFlip"]


def test_flatten_accepts_none_a_bare_transform_and_nested_composes():
    assert flatten(None) == []
    crop = T.RandomCrop(8)
    assert flatten(crop) == [crop]
    assert [type(o).__name__ for o in flatten(PIPELINES["nested compose"])] == ["RandomCrop", "ToTensor"]


@pytest.mark.parametrize(
    "transform, match",
    [
        (
            T.Compose([T.ElasticTransform(alpha=10.0, sigma=1.0), T.ToTensor()]),
            r"ElasticTransform cannot be cached or run batched.*Crop",
        ),
        (T.Compose([T.RandomCrop(32), T.Resize(30)]), r"Resize.*comes after a random op"),
        (T.Compose([T.Lambda(lambda x: x), T.ToTensor()]), "cache_lambda=True"),
        (v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=False)]), "scale=True"),
    ],
)
def test_unsupported_transforms_are_named_with_what_is_supported(transform, match):
    with pytest.raises(UnsupportedTransformError, match=match):
        build_batched(split_transform(transform).device, torch.uint8, (32, 32))


def test_normalize_on_uint8_is_rejected_as_torchvision_would():
    with pytest.raises(ConfigError, match="put ToTensor"):
        build_batched(split_transform(v2.Compose([v2.PILToTensor(), v2.Normalize(M, S)])).device, torch.uint8, (8, 8))


def test_lambda_is_cached_when_asked():
    split = split_transform(
        T.Compose([T.Lambda(lambda im: im.rotate(90)), T.RandomHorizontalFlip()]), cache_lambda=True
    )
    assert [type(op).__name__ for op in split.cached] == ["Lambda"]
    assert isinstance(build_batched(split.device, torch.uint8, (8, 8)).transforms[0], A.RandomHorizontalFlip)


def test_resized_crop_and_color_jitter_convert_with_their_parameters():
    tf = T.Compose(
        [T.RandomResizedCrop(24, scale=(0.5, 1.0), antialias=False), T.ColorJitter(0.4, 0.3, 0.2, 0.1), T.ToTensor()]
    )
    split = split_transform(tf)
    notes = []
    rrc, jitter, to_float = build_batched(split.device, torch.uint8, (32, 32), pil=False, notes=notes).transforms
    assert rrc == A.RandomResizedCrop((24, 24), (0.5, 1.0), (3 / 4, 4 / 3), antialias=False)
    assert jitter.brightness == (0.6, 1.4) and jitter.contrast == (0.7, 1.3) and jitter.hue == (-0.1, 0.1)
    assert isinstance(to_float, A.ConvertDtype) and notes == []
    # On PIL images torchvision runs PIL's kernels: the resize antialiases whatever the flag says, and the
    # jitter's rounding differs; the plan states by how much.
    rrc, jitter, _ = build_batched(split.device, torch.uint8, (32, 32), pil=True, notes=notes).transforms
    assert rrc.antialias is True
    assert len(notes) == 1 and "up to contrast 3, saturation 2, hue 18 intensity levels" in notes[0]


def test_resized_crop_with_another_interpolation_is_refused():
    tf = T.RandomResizedCrop(24, interpolation=T.InterpolationMode.LANCZOS)
    with pytest.raises(UnsupportedTransformError, match="bilinear, bicubic or nearest interpolation, not lanczos"):
        build_batched(split_transform(tf).device, torch.uint8, (32, 32))


def test_per_image_random_ops_on_pil_state_their_measured_difference_or_nothing_when_equal():
    from gpufeed.pipeline.translate.state import PIL_OP_DIFFERENCE

    notes: list[str] = []
    ops = [
        T.RandomPerspective(0.3, 1.0, T.InterpolationMode.BILINEAR),
        T.RandomSolarize(100),
        T.RandomGrayscale(0.5),
        T.RandomRotation(10, T.InterpolationMode.BILINEAR),  # Pillow's kernels on PIL: equal, nothing to say
        T.ToTensor(),
    ]
    build_batched(ops, torch.uint8, (32, 32), pil=True, notes=notes)
    assert len(notes) == 2  # solarize is equal on PIL: nothing to say
    assert PIL_OP_DIFFERENCE[("RandomPerspective", "bilinear")] in notes[0] and "RandomGrayscale" in notes[1]
    tensors: list[str] = []
    build_batched([T.PILToTensor(), *ops[:3]], torch.uint8, (32, 32), pil=True, notes=tensors)
    assert tensors == []  # after PILToTensor the user's pipeline runs the tensor kernels too


def test_a_v2_fill_dict_is_read_by_the_image_type_pil_included():
    import PIL.Image
    import torchvision.transforms.v2 as T2

    fill = {PIL.Image.Image: 127, "others": 3}
    on_pil = build_batched([T2.RandomRotation(30, fill=fill), T2.ToImage()], torch.uint8, (16, 16), pil=True)
    on_tensor = build_batched([T2.RandomRotation(30, fill=fill)], torch.uint8, (16, 16))
    assert on_pil.transforms[0].fill == (127.0,) and on_tensor.transforms[0].fill == (3.0,)


def test_random_choice_weights_line_up_with_ops_that_do_nothing_on_the_device():
    ds = cifar_like(
        8, transform=v2.Compose([v2.ToImage(), v2.RandomChoice([v2.Identity(), v2.RandomInvert(1.0)], p=[0.5, 0.5])])
    )
    loader = gf.accelerate(ds, batch_size=4, device="cpu", progress=False, cache=False)
    assert "RandomChoice(transforms=(Identity(), RandomInvert(p=1.0)), p=(0.5, 0.5))" in loader.plan.batched[0]


def test_v2_fill_none_keeps_the_zero_padded_border_of_bilinear_sampling():
    x = torch.randint(0, 256, (6, 3, 24, 24), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    tf = v2.RandomRotation(20, interpolation=T.InterpolationMode.BILINEAR, fill=None)
    ops = build_batched(split_transform(tf).device, torch.uint8, (24, 24))
    (rot,) = ops.transforms
    assert rot.fill is None
    p = rot.sample(x, torch.Generator().manual_seed(3))
    out = rot.apply(x, p)
    for i in range(6):
        ref = v2.functional.rotate(x[i], float(p["angle"][i]), T.InterpolationMode.BILINEAR, fill=None)
        assert torch.equal(out[i], ref), i
