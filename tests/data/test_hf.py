"""Hugging Face ``datasets`` as a source (gpufeed.read.hf): every kind of image a user's dataset holds, decoded as
``datasets`` decodes it; evaluation recipes equal to ``with_transform`` + DataLoader; training recipes equal to the
same images served from an image folder; views, caches, resume, ranks. Datasets are built locally: nothing reaches
the Hub."""

from __future__ import annotations

import io
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.v2 as v2
from PIL import Image
from tests.contracts import check_resume

import gpufeed as gf
from gpufeed.errors import ConfigError, DataError
from gpufeed.store.encoded import decode

datasets = pytest.importorskip("datasets")

_RNG = np.random.default_rng(7)


def _photo(h: int, w: int) -> np.ndarray:
    """A smooth image with some noise: JPEG keeps it close, so a wrong turn or channel shows."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // max(1, w - 1), y * 255 // max(1, h - 1), (x + y) * 127 // max(1, h + w - 2)], -1)
    return np.clip(base + _RNG.integers(-20, 20, (h, w, 3)), 0, 255).astype(np.uint8)


def _encode(image: Image.Image, fmt: str, **kw: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kw)
    return out.getvalue()


def _oriented_jpeg(h: int, w: int, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return _encode(Image.fromarray(_photo(h, w)), "JPEG", quality=92, exif=exif)


def _kinds() -> dict[str, bytes]:
    """One file of every kind the tests cover (the name says what it is)."""
    rgba = np.dstack([_photo(30, 41), _RNG.integers(0, 255, (30, 41), dtype=np.uint8)])
    return {
        "jpeg": _encode(Image.fromarray(_photo(37, 52)), "JPEG", quality=90),
        "progressive": _encode(Image.fromarray(_photo(44, 33)), "JPEG", quality=85, progressive=True),
        "gray-jpeg": _encode(Image.fromarray(_photo(35, 40)).convert("L"), "JPEG"),
        "cmyk-jpeg": _encode(Image.fromarray(_photo(36, 38)).convert("CMYK"), "JPEG"),
        "exif-6": _oriented_jpeg(31, 47, 6),
        "exif-3": _oriented_jpeg(33, 45, 3),
        "exif-8": _oriented_jpeg(40, 29, 8),
        "png-rgb": _encode(Image.fromarray(_photo(34, 39)), "PNG"),
        "png-rgba": _encode(Image.fromarray(rgba, "RGBA"), "PNG"),
        "png-palette": _encode(Image.fromarray(_photo(32, 42)).convert("P", palette=Image.Palette.ADAPTIVE), "PNG"),
        "png-16bit": _encode(Image.fromarray(_photo(30, 36)[..., 0].astype(np.uint16) * 257), "PNG"),
        "png-gray": _encode(Image.fromarray(_photo(38, 30)).convert("L"), "PNG"),
    }


KINDS = _kinds()
NAMES = ["cat", "dog", "fox"]


def _features(label: str = "class") -> datasets.Features:
    kind = datasets.ClassLabel(names=NAMES) if label == "class" else datasets.Value("int64")
    return datasets.Features({"image": datasets.Image(), "label": kind})


def _dataset(images: list[bytes], labels: list[int] | None = None, label: str = "class") -> datasets.Dataset:
    labels = labels if labels is not None else [i % len(NAMES) for i in range(len(images))]
    rows = {"image": [{"bytes": b, "path": None} for b in images], "label": labels}
    return datasets.Dataset.from_dict(rows, features=_features(label))


def _mixed(n: int = 36) -> datasets.Dataset:
    kinds = list(KINDS.values())
    return _dataset([kinds[i % len(kinds)] for i in range(n)])


EVAL = v2.Compose([v2.Resize(28), v2.CenterCrop(24), v2.PILToTensor()])
TRAIN = v2.Compose(
    [v2.PILToTensor(), v2.RandomResizedCrop(24), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True)]
)


def _reference(ds: datasets.Dataset, recipe: object, batch_size: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """What the user's path yields: ``with_transform`` + ``DataLoader``, in order."""

    def fn(batch: dict) -> dict:
        return {"pixel_values": [recipe(im.convert("RGB")) for im in batch["image"]], "label": batch["label"]}

    loader = torch.utils.data.DataLoader(ds.with_transform(fn), batch_size=batch_size, shuffle=False)
    return [(b["pixel_values"], b["label"]) for b in loader]


def _upright(ds: datasets.Dataset, i: int) -> np.ndarray:
    return np.asarray(ds[i]["image"].convert("RGB"))


def _hwc(image: torch.Tensor) -> np.ndarray:
    """A stored image as (H, W, C), whichever layout its store keeps."""
    return (image if image.shape[-1] == 3 else image.permute(1, 2, 0)).numpy()


def _accelerate(ds: object, **kw: object) -> object:
    kw.setdefault("device", "cpu")
    kw.setdefault("progress", False)
    kw.setdefault("cache", False)
    return gf.accelerate(ds, **kw)


@pytest.mark.parametrize("store", ["pixels", "jpeg"])
def test_every_kind_of_image_decodes_to_datasets_own_pixels(store: str) -> None:
    ds = _mixed()
    loader = _accelerate(ds, batch_size=8, transform=TRAIN, store=store, shuffle=False)
    held = loader.store
    images = decode(held, torch.device("cpu")) if store == "jpeg" else held
    assert len(images) == len(ds)
    for i in range(len(ds)):
        np.testing.assert_array_equal(
            _hwc(images.image(i)), _upright(ds, i), err_msg=f"row {i} ({list(KINDS)[i % len(KINDS)]})"
        )


def test_an_evaluation_recipe_equals_with_transform_and_a_dataloader() -> None:
    ds = _mixed(30)
    loader = _accelerate(ds, batch_size=8, transform=EVAL, shuffle=False)
    got = list(loader)
    want = _reference(ds, EVAL)
    assert len(got) == len(want) == 4
    for (x, y), (wx, wy) in zip(got, want, strict=True):
        assert torch.equal(x, wx)
        assert torch.equal(y, wy)


def _folder(tmp_path: Path, files: list[bytes], labels: list[int]) -> tuple[Path, list[int]]:
    """The same files as an ImageFolder; returns the order ImageFolder lists them in (by class, then name)."""
    for i, (data, label) in enumerate(zip(files, labels, strict=True)):
        (tmp_path / NAMES[label]).mkdir(parents=True, exist_ok=True)
        (tmp_path / NAMES[label] / f"{i:04d}.jpg").write_bytes(data)
    return tmp_path, sorted(range(len(files)), key=lambda i: (labels[i], i))


@pytest.mark.parametrize("store", ["pixels", "jpeg"])
def test_a_training_recipe_serves_what_the_same_images_in_a_folder_serve(tmp_path: Path, store: str) -> None:
    """The same images in the same order, as a folder and as a dataset: bit for bit the same augmented batches
    (the folder route's distribution tests then hold for this source too)."""
    from torchvision.datasets import ImageFolder

    files = [_encode(Image.fromarray(_photo(30 + i % 9, 34 + i % 7)), "JPEG", quality=90) for i in range(40)]
    labels = [i % 3 for i in range(40)]
    root, order = _folder(tmp_path, files, labels)
    ds = _dataset([files[i] for i in order], [labels[i] for i in order])
    kw = {"batch_size": 8, "transform": TRAIN, "store": store, "seed": 3}
    from_hf, from_folder = _accelerate(ds, **kw), _accelerate(ImageFolder(str(root)), **kw)
    for epoch in range(2):
        a, b = list(from_hf), list(from_folder)
        assert len(a) == len(b) == 5
        for (x, y), (fx, fy) in zip(a, b, strict=True):
            assert torch.equal(x, fx), f"epoch {epoch}"
            assert torch.equal(y, fy)
    first, second = (torch.cat([x for x, _ in from_hf]) for _ in range(2))
    assert not torch.equal(first, second)  # each epoch its own draws


def test_views_of_a_dataset_serve_their_own_rows() -> None:
    ds = _mixed(48)
    parts = {
        "select": ds.select([5, 3, 40, 11, 0, 27, 33, 19, 8]),
        "filter": ds.filter(lambda row: row["label"] != 1),
        "shuffle": ds.shuffle(seed=4),
        "train_test_split": ds.train_test_split(test_size=0.25, seed=2)["test"],
    }
    for name, part in parts.items():
        got = list(_accelerate(part, batch_size=4, transform=EVAL, shuffle=False))
        want = _reference(part, EVAL, batch_size=4)
        assert len(got) == len(want), name
        for (x, y), (wx, wy) in zip(got, want, strict=True):
            assert torch.equal(x, wx), name
            assert torch.equal(y, wy), name
        files = _accelerate(part, batch_size=4, transform=TRAIN, store="jpeg").store
        raw = part.cast_column("image", datasets.Image(decode=False))
        assert [bytes(files.file(i).numpy()) for i in range(len(part))] == [r["bytes"] for r in raw["image"]], name


def test_labels_from_a_classlabel_an_integer_column_or_none() -> None:
    images = [KINDS["jpeg"]] * 6
    by_class = _accelerate(_dataset(images), batch_size=6, transform=TRAIN, shuffle=False)
    assert next(iter(by_class))[1].tolist() == [0, 1, 2, 0, 1, 2]
    ints = _dataset(images, [7, 3, 9, 0, 1, 2], label="int")
    assert next(iter(_accelerate(ints, batch_size=6, transform=TRAIN, shuffle=False)))[1].tolist() == [7, 3, 9, 0, 1, 2]
    alone = _accelerate(ints, batch_size=3, transform=TRAIN, shuffle=False, label_key=None)
    batches = list(alone)
    assert len(batches) == 2 and all(isinstance(b, torch.Tensor) and b.shape == (3, 3, 24, 24) for b in batches)
    with pytest.raises(ConfigError, match="label_key=None reads images alone"):
        _accelerate(ints, batch_size=3, transform=TRAIN, label_key=None, mix=v2.MixUp(num_classes=10))
    missing = _dataset(images, [0, 1, -1, 2, 0, 1])
    with pytest.raises(DataError, match=r"row 2 has label -1"):
        _accelerate(missing, batch_size=3, transform=TRAIN)


def test_columns_are_found_or_named() -> None:
    ds = _mixed(6).rename_column("image", "img").rename_column("label", "fine")
    loader = _accelerate(ds, batch_size=3, transform=TRAIN, shuffle=False)  # found from the features
    assert next(iter(loader))[1].tolist() == [0, 1, 2]
    with pytest.raises(ConfigError, match=r"image_key='image' is not a column.*img \(Image\)"):
        _accelerate(ds, batch_size=3, transform=TRAIN, image_key="image")
    two = ds.add_column("other", [KINDS["jpeg"]] * 6).cast_column("other", datasets.Image())
    with pytest.raises(ConfigError, match=r"2 Image columns \(\['img', 'other'\]\).*image_key="):
        _accelerate(two, batch_size=3, transform=TRAIN)
    assert len(list(_accelerate(two, batch_size=3, transform=TRAIN, image_key="other"))) == 2
    with pytest.raises(ConfigError, match="label_key='img' is a Image"):
        _accelerate(ds, batch_size=3, transform=TRAIN, label_key="img")
    with pytest.raises(ConfigError, match="name the columns of a Hugging Face"):
        _accelerate(torch.utils.data.TensorDataset(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.arange(4)),
                    batch_size=2, image_key="x")  # fmt: skip


def test_a_set_transform_function_is_refused_with_the_change_or_replaced() -> None:
    ds = _mixed(8)

    def to_pixels(batch: dict) -> dict:
        return {"pixel_values": [EVAL(im.convert("RGB")) for im in batch["image"]], "label": batch["label"]}

    with pytest.raises(
        ConfigError, match=r"to_pixels.*columns \['image', 'label'\].*gf.accelerate\(ds, transform=RECIPE"
    ):
        _accelerate(ds.with_transform(to_pixels), batch_size=4)
    loader = _accelerate(ds.with_transform(to_pixels), batch_size=4, transform=EVAL, shuffle=False)
    assert "to_pixels" in str(loader.plan) and "replaced by the recipe given" in str(loader.plan)
    assert torch.equal(next(iter(loader))[0], _reference(ds, EVAL, 4)[0][0])


def test_splits_and_streams_are_refused_naming_what_to_pass_and_what_is_named_is_accepted(tmp_path: Path) -> None:
    dd = datasets.DatasetDict({"test": _mixed(4), "train": _mixed(4)})
    with pytest.raises(ConfigError, match=r"splits \['test', 'train'\].*gf.accelerate\(ds\['train'\]"):
        _accelerate(dd, batch_size=2, transform=TRAIN)
    assert len(_accelerate(dd["train"], batch_size=2, transform=TRAIN)) == 2  # what it names, as it names it
    with pytest.raises(ConfigError, match="streaming=True.*gpufeed convert reads files on disk, not a stream"):
        _accelerate(_mixed(4).to_iterable_dataset(), batch_size=2, transform=TRAIN)
    _mixed(6).to_parquet(str(tmp_path / "train.parquet"))
    arguments = {"path": "parquet", "data_files": {"train": str(tmp_path / "train.parquet")}}
    streamed = datasets.load_dataset(**arguments, streaming=True)  # an IterableDatasetDict
    with pytest.raises(ConfigError) as refused:
        _accelerate(streamed, batch_size=2, transform=TRAIN)
    message = str(refused.value)
    assert "an IterableDatasetDict of the splits ['train']" in message and "neither has each of its splits" in message
    assert "gpufeed convert reads files on disk, not a stream: download them first" in message
    with pytest.raises(ConfigError, match="streaming=True"):  # its split, passed on its own: refused too, as said
        _accelerate(streamed["train"], batch_size=2, transform=TRAIN)
    said = "load_dataset(<the same arguments, without streaming=True>, split='train')"
    assert said in message
    ds = datasets.load_dataset(**arguments, split="train", cache_dir=str(tmp_path / "hf"))  # run as said
    assert next(iter(_accelerate(ds, batch_size=6, transform=TRAIN, shuffle=False)))[1].tolist() == [0, 1, 2] * 2


def test_images_given_by_path_are_read_from_their_files(tmp_path: Path) -> None:
    paths = []
    for i, name in enumerate(["jpeg", "png-rgba", "exif-6", "gray-jpeg"]):
        p = tmp_path / f"{i}.img"
        p.write_bytes(KINDS[name])
        paths.append(str(p))
    ds = datasets.Dataset.from_dict({"image": paths, "label": [0, 1, 2, 0]}, features=_features())
    loader = _accelerate(ds, batch_size=2, transform=TRAIN, store="pixels", shuffle=False)
    assert "read from their files" in str(loader.plan)
    for i in range(4):
        np.testing.assert_array_equal(_hwc(loader.store.image(i)), _upright(ds, i))
    got = list(_accelerate(ds, batch_size=2, transform=EVAL, shuffle=False))
    for (x, _), (wx, _) in zip(got, _reference(ds, EVAL, 2), strict=True):
        assert torch.equal(x, wx)


@pytest.mark.parametrize("store", ["pixels", "jpeg"])
def test_a_corrupt_image_is_named_at_build_time_or_skipped(store: str) -> None:
    good = [KINDS["jpeg"], KINDS["png-rgb"]] * 4
    broken = KINDS["jpeg"][: len(KINDS["jpeg"]) // 3]  # a truncated JPEG: its header reads, its pixels do not
    garbage = b"not an image at all"
    ds = _dataset(good[:3] + [broken] + good[3:6] + [garbage] + good[6:])
    with pytest.raises(DataError, match=r"(?s)2 of 10 files.*row 3: cannot.*row 7: cannot"):
        _accelerate(ds, batch_size=2, transform=TRAIN, store=store)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = _accelerate(ds, batch_size=2, transform=TRAIN, store=store, on_error="skip", shuffle=False)
    assert any("left out 2 of 10" in str(w.message) for w in caught)
    assert len(loader.store) == 8
    assert torch.cat([y for _, y in loader]).tolist() == [ds[i]["label"] for i in range(10) if i not in (3, 7)]


def test_the_jpeg_store_serves_the_arrow_bytes_without_a_copy(tmp_path: Path) -> None:
    files = [KINDS["jpeg"], KINDS["progressive"], KINDS["png-rgb"]] * 10
    _dataset(files).save_to_disk(str(tmp_path / "one"))
    ds = datasets.load_from_disk(str(tmp_path / "one"))
    loader = _accelerate(ds, batch_size=5, transform=TRAIN, store="jpeg")
    held = loader.store
    arrow = ds.data.table.column("image").chunks
    lo = min(c.field("bytes").buffers()[2].address for c in arrow)
    hi = max(c.field("bytes").buffers()[2].address + c.field("bytes").buffers()[2].size for c in arrow)
    assert lo <= held.data.data_ptr() and held.data.data_ptr() + held.data.numel() <= hi  # a view of the file
    assert "not copied" in str(loader.plan)
    assert [bytes(held.file(i).numpy()) for i in range(len(ds))] == files
    # placed for a GPU, the view stays the view: pinning it would copy the whole column into page-locked RAM
    on_gpu = held.placed("jpeg", torch.device("cuda"))
    assert held.mapped and on_gpu.nvjpeg and on_gpu.data is held.data and "nvJPEG" in on_gpu.describe()
    _dataset(files).save_to_disk(str(tmp_path / "two"), num_shards=2)
    split = datasets.load_from_disk(str(tmp_path / "two"))
    assert len(split.cache_files) == 2
    copied = _accelerate(split, batch_size=5, transform=TRAIN, store="jpeg")
    assert "span several Arrow files" in str(copied.plan) and not copied.store.mapped  # its own buffer: pinned on a GPU
    assert [bytes(copied.store.file(i).numpy()) for i in range(len(split))] == files
    joined = datasets.concatenate_datasets([_dataset(files[:12]), _dataset(files[12:])])  # in memory, 2 chunks
    assert not joined.cache_files and joined.data.table.column("image").num_chunks == 2
    copied = _accelerate(joined, batch_size=5, transform=TRAIN, store="jpeg")
    assert "the column's 2 chunks lie in separate buffers in memory: their bytes copied" in str(copied.plan)
    assert [bytes(copied.store.file(i).numpy()) for i in range(len(joined))] == files


def test_imagefolder_and_parquet_builders_read_as_their_rows(tmp_path: Path) -> None:
    files = [_encode(Image.fromarray(_photo(30 + i, 28 + i)), "JPEG") for i in range(9)]
    root, _ = _folder(tmp_path / "folder", files, [i % 3 for i in range(9)])
    built = datasets.load_dataset("imagefolder", data_dir=str(root), split="train", cache_dir=str(tmp_path / "hf"))
    assert isinstance(built.features["label"], datasets.ClassLabel)
    got = list(_accelerate(built, batch_size=3, transform=EVAL, shuffle=False))
    for (x, y), (wx, wy) in zip(got, _reference(built, EVAL, 3), strict=True):
        assert torch.equal(x, wx) and torch.equal(y, wy)
    _mixed(12).to_parquet(str(tmp_path / "rows.parquet"))
    parquet = datasets.load_dataset("parquet", data_files=str(tmp_path / "rows.parquet"), split="train",
                                    cache_dir=str(tmp_path / "hf"))  # fmt: skip
    loader = _accelerate(parquet, batch_size=4, transform=EVAL, shuffle=False)
    for (x, y), (wx, wy) in zip(loader, _reference(parquet, EVAL, 4), strict=True):
        assert torch.equal(x, wx) and torch.equal(y, wy)


def test_the_pixel_store_is_cached_by_the_datasets_fingerprint(tmp_path: Path) -> None:
    ds = _mixed(20)
    kw = {"batch_size": 4, "transform": TRAIN, "store": "pixels", "cache": tmp_path}
    first = _accelerate(ds, **kw)
    again = _accelerate(ds, **kw)
    assert "cache hit" in str(again.plan) and "cache hit" not in str(first.plan)
    assert torch.equal(first.store.data, again.store.data)
    part = _accelerate(ds.select(range(10)), **kw)  # another view: its own entry
    assert "cache hit" not in str(part.plan) and len(part.store) == 10
    other = _dataset([KINDS["png-rgb"]] * 20)
    assert "cache hit" not in str(_accelerate(other, **kw).plan)


def test_resume_is_bit_exact_and_ranks_share_the_rows() -> None:
    ds = _mixed(40)
    check_resume(lambda: _accelerate(ds, batch_size=6, transform=TRAIN, store="jpeg", seed=5))
    shares = []
    for rank in range(2):
        loader = _accelerate(ds, batch_size=5, transform=EVAL, rank=rank, world_size=2, seed=1)
        shares.append(torch.cat([y for _, y in loader]))
        assert len(loader) == 4
    labels = torch.tensor([ds[i]["label"] for i in range(40)])
    assert torch.equal(torch.sort(torch.cat(shares)).values, torch.sort(labels).values)


def test_fallback_runs_the_recipe_per_sample() -> None:
    ds = _mixed(12)

    def opaque(image: Image.Image) -> torch.Tensor:  # a function gpufeed cannot split
        return EVAL(image)

    with pytest.warns(UserWarning, match="falls back"):
        loader = _accelerate(ds, batch_size=4, transform=opaque, shuffle=False, fallback="prefetch", num_workers=0)
    for (x, y), (wx, wy) in zip(loader, _reference(ds, EVAL, 4), strict=True):
        assert torch.equal(x, wx) and torch.equal(y, wy)


def _with_nulls(nulls: list[int], n: int = 9) -> tuple[datasets.Dataset, list[bytes]]:
    """``n`` rows of distinct JPEGs and PNGs (labels 0..n-1), the rows ``nulls`` holding no image (None)."""
    files = [
        _encode(Image.fromarray(_photo(26 + i, 30 + i % 4)), "PNG" if i % 3 == 2 else "JPEG", quality=90)
        for i in range(n)
    ]
    rows = [None if i in nulls else {"bytes": b, "path": None} for i, b in enumerate(files)]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    return datasets.Dataset.from_dict({"image": rows, "label": list(range(n))}, features=features), files


@pytest.mark.parametrize(
    ("nulls", "layout"),
    [
        ([3], "saved"),  # the case: the valid row before the null was reported corrupt
        ([0], "saved"),
        ([8], "saved"),
        ([2, 3, 4], "saved"),  # a run of nulls
        ([0, 1, 7, 8], "two-files"),  # several Arrow files: their bytes packed into one buffer
        ([1, 5], "chunks"),  # one in-memory table of several chunks
        ([4, 6], "parquet"),
    ],
)
def test_null_image_rows_are_named_or_skipped_and_every_other_row_keeps_its_bytes(
    tmp_path: Path, nulls: list[int], layout: str
) -> None:
    ds, files = _with_nulls(nulls)
    if layout == "saved":
        ds.save_to_disk(str(tmp_path / "ds"))
        ds = datasets.load_from_disk(str(tmp_path / "ds"))
    elif layout == "two-files":
        ds.save_to_disk(str(tmp_path / "ds"), num_shards=2)
        ds = datasets.load_from_disk(str(tmp_path / "ds"))
        assert len(ds.cache_files) == 2
    elif layout == "chunks":
        halves = [datasets.Dataset(ds.data.table.slice(a, b - a), info=ds.info) for a, b in ((0, 4), (4, 9))]
        ds = datasets.concatenate_datasets(halves)
        assert ds.data.table.column("image").num_chunks == 2
    else:
        ds.to_parquet(str(tmp_path / "rows.parquet"), batch_size=4)
        ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "rows.parquet"), split="train",
                                   cache_dir=str(tmp_path / "hf"))  # fmt: skip
    kept = [i for i in range(9) if i not in nulls]
    raw = ds.cast_column("image", datasets.Image(decode=False))["image"]
    assert [r is None for r in raw] == [i in nulls for i in range(9)]  # datasets' own rows: the nulls and no other
    for store in ("jpeg", "pixels"):
        with pytest.raises(DataError) as refused:
            _accelerate(ds, batch_size=2, transform=TRAIN, store=store)
        named = [int(r) for r in re.findall(r"\brow (\d+): no image", str(refused.value))]
        assert named == nulls, store
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = _accelerate(ds, batch_size=1, transform=TRAIN, store=store, on_error="skip", shuffle=False)
        assert any(f"left out {len(nulls)} of 9" in str(w.message) for w in caught), store
        assert torch.cat([y for _, y in loader]).tolist() == kept, store  # labels stay with their images
        held = loader.store
        if store == "jpeg":
            assert [bytes(held.file(i).numpy()) for i in range(len(held))] == [files[i] for i in kept]
            assert [bytes(held.file(i).numpy()) for i in range(len(held))] == [raw[i]["bytes"] for i in kept]
        else:
            for j, i in enumerate(kept):
                np.testing.assert_array_equal(_hwc(held.image(j)), _upright(ds, i), err_msg=f"row {i}")


def _columns(**columns: tuple[list, object]) -> datasets.Dataset:
    """Six JPEG rows and the given ``name=(values, feature)`` columns."""
    rows: dict = {"image": [{"bytes": KINDS["jpeg"], "path": None}] * 6}
    features: dict = {"image": datasets.Image()}
    for name, (values, feature) in columns.items():
        rows[name], features[name] = values, feature
    return datasets.Dataset.from_dict(rows, features=datasets.Features(features))


def test_string_labels_are_numbered_by_sorted_names_as_class_encode_column_and_the_plan_says_so(tmp_path: Path) -> None:
    names = ["owl", "cat", "dog", "cat", "owl", "emu"]
    ds = _columns(label=(names, datasets.Value("string")))
    loader = _accelerate(ds, batch_size=6, transform=TRAIN, shuffle=False, cache=tmp_path)
    got = next(iter(loader))[1]
    assert got.tolist() == [3, 0, 1, 0, 3, 2]
    assert got.tolist() == ds.class_encode_column("label")["label"]  # datasets' own numbering
    assert "cat=0, dog=1, emu=2, owl=3 (4 classes)" in str(loader.plan)
    assert "cache hit" in str(_accelerate(ds, batch_size=6, transform=TRAIN, cache=tmp_path).plan)  # stable
    from gpufeed.read.hf import arrow_images

    own = arrow_images(ds).source_identity()
    other = arrow_images(ds, classes=["ant", "cat", "dog", "emu", "owl"])  # numbered by another split's names
    assert own["classes"] == ["cat", "dog", "emu", "owl"] and other.targets == [4, 1, 2, 1, 4, 3]
    assert other.source_identity() != own  # another numbering: another cache entry
    halves = ds.train_test_split(test_size=0.5, seed=0)  # each half numbers as the whole table: the halves agree
    for half in halves.values():
        want = [sorted(set(names)).index(v) for v in half["label"]]
        assert next(iter(_accelerate(half, batch_size=3, transform=TRAIN, shuffle=False)))[1].tolist() == want
    other = _columns(species=(["b", "a", "b", "c", "a", "a"], datasets.Value("large_string")))
    named = _accelerate(other, batch_size=6, transform=TRAIN, shuffle=False, label_key="species")
    assert next(iter(named))[1].tolist() == [1, 0, 1, 2, 0, 0]
    missing = _columns(label=(["a", "b", None, "a", "b", "a"], datasets.Value("string")))
    with pytest.raises(DataError, match=r"row 2 has no label \(None in 'label'\).*label_key=None"):
        _accelerate(missing, batch_size=3, transform=TRAIN)
    two = _columns(label=(names, datasets.Value("string")), target=([0] * 6, datasets.Value("int64")))
    with pytest.raises(ConfigError, match=r"several label columns \(label \(Value\('string'\)\), target \(Value"):
        _accelerate(two, batch_size=3, transform=TRAIN)
    assert next(iter(_accelerate(two, batch_size=6, transform=TRAIN, shuffle=False, label_key="target")))[1].sum() == 0


def test_a_float_label_column_is_refused_unless_named_then_served_as_float32_targets() -> None:
    values = [0.5, 1.25, -2.0, 3.0, 4.5, 1e-3]
    ds = _columns(target=(values, datasets.Value("float64")))
    with pytest.raises(ConfigError) as refused:
        _accelerate(ds, batch_size=3, transform=TRAIN)
    for part in ("'target' holds Value('float64')", "cast_column('target', datasets.Value('int64'))",
                 "label_key='target'", "label_key=None"):  # fmt: skip
        assert part in str(refused.value)
    loader = _accelerate(ds, batch_size=6, transform=TRAIN, shuffle=False, label_key="target")
    got = next(iter(loader))[1]
    assert got.dtype == torch.float32 and torch.equal(got, torch.tensor(values, dtype=torch.float32))
    assert torch.equal(got, ds.with_format("torch")[:6]["target"])  # what the user's own loader would have given
    assert "'target' holds Value('float64') values: served as float32 targets" in str(loader.plan)
    with pytest.raises(ConfigError, match="mix= mixes one-hot class labels.*label_key='target' serves float targets"):
        _accelerate(ds, batch_size=3, transform=TRAIN, label_key="target", mix=v2.MixUp(num_classes=3))
    nan = _columns(target=([0.5, float("nan"), 1.0, 2.0, 3.0, 4.0], datasets.Value("float32")))
    with pytest.raises(DataError, match=r"row 1 has no label \(NaN in 'target'\)"):
        _accelerate(nan, batch_size=3, transform=TRAIN, label_key="target")


def test_without_a_label_column_batches_are_images_alone_and_the_plan_says_so() -> None:
    ds = _columns(caption=(list("abcdef"), datasets.Value("string")))
    loader = _accelerate(ds, batch_size=3, transform=TRAIN, shuffle=False)
    assert all(isinstance(b, torch.Tensor) and b.shape == (3, 3, 24, 24) for b in loader)
    assert "labels: none" in str(loader.plan) and "the columns not read: caption (Value('string'))" in str(loader.plan)
    lists = _columns(labels=([[0, 1]] * 6, datasets.Sequence(datasets.Value("int64"))))  # multi-label: not one class
    with pytest.raises(ConfigError, match=r"label column 'labels' is .*not one class per image.*label_key=None"):
        _accelerate(lists, batch_size=3, transform=TRAIN)


def test_an_image_column_without_decoding_serves_the_same_batches() -> None:
    ds = _mixed(12)
    raw = ds.cast_column("image", datasets.Image(decode=False))
    for recipe in (EVAL, TRAIN):
        a = list(_accelerate(raw, batch_size=4, transform=recipe, seed=2))
        b = list(_accelerate(ds, batch_size=4, transform=recipe, seed=2))
        assert len(a) == len(b) == 3
        for (x, y), (bx, by) in zip(a, b, strict=True):
            assert torch.equal(x, bx) and torch.equal(y, by)
    from gpufeed.read.hf import arrow_images

    image, label = arrow_images(raw)[5]  # sample by sample (the per-sample fallback's path): decoded as Image() does
    assert np.array_equal(np.asarray(image), _upright(ds, 5)) and label == 2
