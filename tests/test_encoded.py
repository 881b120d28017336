"""The encoded store: a folder's own file bytes, read without decoding, decoded each batch to exactly
the pixels the user's ImageFolder loader (PIL, convert("RGB")) gives, whatever the file kind."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image, ImageFile
from torchvision.datasets import DatasetFolder, Food101, ImageFolder
from torchvision.datasets.folder import pil_loader
from torchvision.transforms.functional import pil_to_tensor

import gpufeed as gf
from gpufeed.read.files import file_samples, read_files
from gpufeed.store.encoded import Encoded, decode
from gpufeed.store.ragged import Ragged

from fakes import PHOTO_KINDS, snapshot

# the kinds these stores' tests were built around (16-bit PNG and lossless RGBA WebP: tests/test_decoders.py)
KINDS = [kind for kind in PHOTO_KINDS if kind[0] not in ("gray16.png", "lossless.webp")]


def _photo(h, w, seed):
    """Smooth colour plus noise: compresses like a photo, not like white noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([128 + 100 * np.sin(xx / (7 + c) + yy / (11 + 2 * c) + seed) for c in range(3)], -1)
    return np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)


def _folder(root, n_per_kind=1):
    for k, (name, mode, fmt, options) in enumerate(KINDS):
        for j in range(n_per_kind):
            folder = root / f"class{(k + j) % 3}"
            folder.mkdir(parents=True, exist_ok=True)
            image = Image.fromarray(_photo(37 + 11 * k + j, 50 + 7 * k, k + 10 * j)).convert(mode)
            image.save(folder / f"{j}_{name}", format=fmt, **options)
    return root


def test_every_kind_of_file_decodes_to_the_pixels_of_the_user_s_loader(tmp_path):
    ds = ImageFolder(str(_folder(tmp_path)))
    encoded, labels = read_files(ds, progress=False)
    assert len(encoded) == len(KINDS) and labels.tolist() == ds.targets
    assert encoded.jpeg.tolist() == [path.endswith(".jpg") for path, _ in ds.samples]
    for threads in (1, 3):
        images = decode(encoded, torch.device("cpu"), threads)
        for i, (path, _) in enumerate(ds.samples):
            assert torch.equal(images.image(i), pil_to_tensor(pil_loader(path))), path  # bit for bit


def test_reading_the_folder_decodes_nothing(tmp_path, monkeypatch):
    ds = ImageFolder(str(_folder(tmp_path)))

    def refuse(self, *args, **kwargs):
        raise AssertionError("decoded while reading the folder")

    monkeypatch.setattr(Image.Image, "load", refuse)
    monkeypatch.setattr(ImageFile.ImageFile, "load", refuse)
    encoded, _ = read_files(ds, progress=False)
    sizes = [tuple(s) for s in encoded.shapes.tolist()]
    monkeypatch.undo()
    assert sizes == [(3, *reversed(Image.open(p).size)) for p, _ in ds.samples]
    assert encoded.data.nbytes == sum((tmp_path / p).stat().st_size for p, _ in ds.samples)


def test_only_datasets_read_by_torchvision_s_pil_loader_are_file_backed(tmp_path):
    root = _folder(tmp_path)
    assert file_samples(ImageFolder(str(root))) is not None
    gray = ImageFolder(str(root), loader=lambda p: Image.open(p).convert("L"))  # the user's loader: not ours
    assert file_samples(gray) is None

    class Mine(ImageFolder):
        def __getitem__(self, i):
            return super().__getitem__(i)

    assert file_samples(Mine(str(root))) is None
    plus_one = ImageFolder(str(root), target_transform=lambda t: t + 10)
    assert read_files(plus_one, progress=False)[1].tolist() == [t + 10 for t in plus_one.targets]
    data = DatasetFolder(str(root), loader=pil_loader, extensions=(".jpg",))
    assert [p for p, _ in file_samples(data)] == [p for p, _ in data.samples]


def test_food101_reads_its_image_files(tmp_path):
    base = tmp_path / "food-101"
    meta = {"apple_pie": ["apple_pie/1", "apple_pie/2"], "bibimbap": ["bibimbap/3"]}
    for rel in [r for rels in meta.values() for r in rels]:
        (base / "images" / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(_photo(40, 60, len(rel))).save(base / "images" / f"{rel}.jpg")
    (base / "meta").mkdir()
    (base / "meta" / "train.json").write_text(json.dumps(meta))
    ds = Food101(str(tmp_path), split="train")
    encoded, labels = read_files(ds, progress=False)
    assert labels.tolist() == [0, 0, 1] and len(encoded) == 3
    images = decode(encoded, torch.device("cpu"))
    assert all(torch.equal(images.image(i), pil_to_tensor(ds[i][0])) for i in range(3))


RECIPE = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize([0.5] * 3, [0.2] * 3)])


def _epochs(loader, n=2):
    return [[(x.clone(), y.clone()) for x, y in loader] for _ in range(n)]


def test_the_jpeg_store_serves_the_pixel_store_s_batches(tmp_path):
    ds = ImageFolder(str(_folder(tmp_path, n_per_kind=3)), transform=RECIPE)
    before = snapshot(tmp_path)
    kw = dict(batch_size=7, device="cpu", seed=4, cache=False, progress=False)
    jpeg = gf.accelerate(ds, store="jpeg", **kw)
    pixels = gf.accelerate(ds, store="pixels", **kw)
    assert isinstance(jpeg.images, Encoded) and isinstance(pixels.images, Ragged)
    assert "encoded files: 30 images" in str(jpeg.plan) and "(store='jpeg')" in str(jpeg.plan)
    for a, b in zip(_epochs(jpeg), _epochs(pixels), strict=True):
        assert len(a) == 5 and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b, strict=True))
    assert snapshot(tmp_path) == before  # nothing written into the user's folder


def test_auto_keeps_pixels_that_fit_and_bytes_that_do_not(tmp_path):
    ds = ImageFolder(str(_folder(tmp_path)), transform=RECIPE)
    kw = dict(batch_size=4, device="cpu", cache=False, progress=False)
    assert isinstance(gf.accelerate(ds, **kw).images, Ragged)
    small = gf.accelerate(ds, memory_budget=10_000, **kw)
    assert isinstance(small.images, Encoded)
    assert "decoded they would take" in str(small.plan) and "over the budget of" in str(small.plan)


def test_store_jpeg_is_refused_where_the_files_bytes_are_not_the_images(tmp_path):
    root = _folder(tmp_path)
    custom = ImageFolder(str(root), transform=RECIPE, loader=lambda p: Image.open(p).convert("RGB"))
    with pytest.raises(gf.ConfigError, match="not a folder of image files read by torchvision's PIL loader"):
        gf.accelerate(custom, store="jpeg", device="cpu", cache=False, progress=False)
    assert isinstance(gf.accelerate(custom, store="auto", device="cpu", cache=False, progress=False).images, Ragged)
    resized = ImageFolder(str(root), transform=T.Compose([T.Resize(30), T.RandomResizedCrop(24), T.ToTensor()]))
    with pytest.raises(gf.ConfigError, match=r"cached part \(Resize.*changes the images"):
        gf.accelerate(resized, store="jpeg", device="cpu", cache=False, progress=False)
    with pytest.raises(gf.ConfigError, match="store='png' must be one of"):
        gf.accelerate(custom, store="png", device="cpu")


def test_a_file_that_is_not_an_image_is_named(tmp_path):
    root = _folder(tmp_path)
    (root / "class0" / "broken.jpg").write_bytes(b"not a jpeg at all")
    with pytest.raises(gf.DataError, match=r"broken\.jpg: cannot be read as an image"):
        read_files(ImageFolder(str(root)), progress=False)


def test_max_side_downscales_the_pixel_store_as_torchvision_s_resize_would_and_says_so(tmp_path):
    import torchvision.transforms.v2 as v2

    ds = ImageFolder(str(_folder(tmp_path)), transform=RECIPE)
    loader = gf.accelerate(ds, batch_size=4, device="cpu", cache=False, progress=False, max_side=60)
    images = loader.images
    assert isinstance(images, Ragged) and int(images.shapes[:, 1:].max()) <= 60
    for i, (path, _) in enumerate(ds.samples):
        original = pil_to_tensor(pil_loader(path))
        h, w = original.shape[1:]
        expected = v2.Resize(size=None, max_size=60)(original) if max(h, w) > 60 else original
        assert torch.equal(images.image(i), expected), path
    shrunk = sum(max(Image.open(p).size) > 60 for p, _ in ds.samples)
    assert f"max_side=60: {shrunk} of {len(ds)} images, those with a longer side over 60, downscaled" in str(
        loader.plan
    )
    kw = dict(device="cpu", cache=False, progress=False)
    with pytest.raises(gf.ConfigError, match="store='jpeg' keeps the files as they are"):
        gf.accelerate(ds, store="jpeg", max_side=60, **kw)
    with pytest.raises(gf.ConfigError, match="with max_side=60 the pixels still take"):
        gf.accelerate(ds, memory_budget=1000, max_side=60, **kw)
    with pytest.raises(gf.ConfigError, match="max_side=0 must be"):
        gf.accelerate(ds, max_side=0, **kw)


@pytest.mark.parametrize("store", ["pixels", "jpeg"])
def test_both_stores_are_cached_verified_and_served_the_same_from_the_cache(tmp_path, store):
    ds = ImageFolder(str(_folder(tmp_path / "photos", n_per_kind=2)), transform=RECIPE)
    kw = dict(batch_size=6, device="cpu", seed=3, progress=False, store=store, cache=tmp_path / "cache")
    first = gf.accelerate(ds, **kw)
    assert "written to the cache" in first.plan.ingest and first.plan.cache_path is not None
    hit = gf.accelerate(ds, **kw)
    assert hit.plan.ingest.startswith("cache hit, verified (20 samples)")
    assert type(hit.images) is type(first.images) and hit.plan.cache_path == first.plan.cache_path
    epoch0 = list(first)
    for (x, y), (u, v) in zip(epoch0, hit, strict=True):
        assert torch.equal(x, u) and torch.equal(y, v)
    other = "jpeg" if store == "pixels" else "pixels"  # each kind has its own entry
    assert gf.accelerate(ds, **{**kw, "store": other}).plan.cache_path != first.plan.cache_path
    entry = Path(first.plan.cache_path)
    data = entry / ("pixels.bin" if store == "pixels" else "bytes.bin")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte in the middle: caught by the block hashes, rebuilt
    data.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="rebuilding the cache: .* do not match the manifest's hash"):
        rebuilt = gf.accelerate(ds, **kw)
    assert all(torch.equal(x, u) for (x, _), (u, _) in zip(epoch0, rebuilt, strict=True))


def _truncated_folder(root):
    ds = ImageFolder(str(_folder(root)), transform=RECIPE)
    broken = next(Path(p) for p, _ in ds.samples[1:4] if p.endswith(".jpg"))  # not a sample the probe reads
    broken.write_bytes(broken.read_bytes()[: broken.stat().st_size * 2 // 3])
    return ds, broken


def test_a_truncated_jpeg_is_named_and_read_as_pil_reads_it(tmp_path, monkeypatch):
    ds, broken = _truncated_folder(tmp_path)
    kw = dict(batch_size=4, device="cpu", cache=False, progress=False)
    named = rf"sample \d+ \({broken}\) cannot be decoded .*PIL cannot read it either"
    with pytest.raises(gf.DataError, match=named):
        gf.accelerate(ds, store="pixels", **kw)  # decoded while the store is built
    with pytest.raises(gf.DataError, match=named):  # the loader's first two samples are decoded when it is built
        list(gf.accelerate(ds, store="jpeg", **kw))
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)  # as many ImageNet scripts set it
    encoded, _ = read_files(ds, progress=False)
    images = decode(encoded, torch.device("cpu"))
    i = [p for p, _ in ds.samples].index(str(broken))
    assert torch.equal(images.image(i), pil_to_tensor(pil_loader(str(broken))))  # what the user's loader reads


def test_a_decompression_bomb_is_refused_by_name_as_pil_refuses_it(tmp_path, monkeypatch):
    ds = ImageFolder(str(_folder(tmp_path)), transform=RECIPE)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)  # every image here is over twice that
    with pytest.raises(gf.DataError, match=r"\.(jpg|png|webp): .*raise PIL.Image.MAX_IMAGE_PIXELS"):
        read_files(ds, progress=False)


def test_decoding_works_in_a_forked_child_after_the_parent_decoded(tmp_path):
    import multiprocessing

    ds = ImageFolder(str(_folder(tmp_path)))
    encoded, _ = read_files(ds, progress=False)
    expected = decode(encoded, torch.device("cpu"), threads=2)  # the parent's decode threads exist now
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        result = pool.apply_async(_decode_sum, (encoded,))
        assert result.get(timeout=60) == int(expected.data.numpy().sum(dtype=np.int64))  # hung with the parent's pool


def _decode_sum(encoded):
    torch.set_num_threads(1)  # as DataLoader workers do: torch's own OpenMP pool is not fork-safe
    return int(decode(encoded, torch.device("cpu"), threads=2).data.numpy().sum(dtype=np.int64))


def test_max_side_keeps_at_least_one_pixel_on_the_short_side(tmp_path):
    root = tmp_path / "wide" / "a"
    root.mkdir(parents=True)
    Image.fromarray(_photo(2, 400, 1)).save(root / "strip.png")
    Image.fromarray(_photo(50, 60, 2)).save(root / "small.png")
    ds = ImageFolder(str(tmp_path / "wide"), transform=RECIPE)
    loader = gf.accelerate(ds, batch_size=2, device="cpu", cache=False, progress=False, max_side=100)
    assert sorted(loader.images.shapes.tolist()) == [[3, 1, 100], [3, 50, 60]]
    assert [tuple(x.shape) for x, _ in loader] == [(2, 3, 24, 24)]
