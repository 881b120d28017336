"""Every store kind through the one Store interface: the same pixels however a chunk is reached."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from gpufeed.cache import write_cache
from gpufeed.errors import CacheError, DataError
from gpufeed.store import Dense, Encoded, Ragged, Store, as_store, from_arrays
from gpufeed.store.entry import open_cache

SIZES = [(5, 7), (9, 4), (6, 6), (3, 8), (7, 5), (4, 9)]  # (H, W) of each image of the ragged kinds


def _images(kind: str) -> list[torch.Tensor]:
    """The ``(C, H, W)`` uint8 images a store of ``kind`` holds: one size for dense, different sizes otherwise."""
    rng = np.random.default_rng(7)
    sizes = [(5, 7)] * len(SIZES) if kind == "dense" else SIZES
    return [torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8)) for h, w in sizes]


def _png(image: torch.Tensor) -> torch.Tensor:
    out = io.BytesIO()
    Image.fromarray(image.permute(1, 2, 0).numpy()).save(out, format="PNG")  # lossless: decodes to these pixels
    return torch.frombuffer(bytearray(out.getvalue()), dtype=torch.uint8)


def _store(kind: str) -> Store:
    images = _images(kind)
    if kind == "dense":
        return Dense(torch.stack(images))
    if kind == "pixels":
        return Ragged.stack(images)
    files = [_png(im) for im in images]
    lengths = torch.tensor([f.numel() for f in files])
    shapes = torch.tensor([list(im.shape) for im in images])
    starts = torch.cumsum(lengths, 0) - lengths
    return Encoded(torch.cat(files), starts, lengths, shapes, torch.zeros(len(files), dtype=torch.bool))


def _pixels(batch: torch.Tensor | Ragged) -> list[torch.Tensor]:
    """A batch as the transform receives it, as a list of ``(C, H, W)`` images on the CPU."""
    if isinstance(batch, Ragged):
        return [batch.image(i).cpu() for i in range(len(batch))]
    return [image.cpu() for image in batch]


def _same(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    return len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


KINDS = ["dense", "pixels", "jpeg"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_way_to_a_chunk_gives_the_stored_pixels(kind, device):
    store, images = _store(kind), _images(kind)
    idx = torch.tensor([4, 0, 2, 0])  # out of order, one repeated
    want = [images[i] for i in idx.tolist()]
    assert store.kind == kind and len(store) == 6 and store.dtype == torch.uint8
    assert store.ragged == (kind != "dense")
    assert store.stored_shape == ((6, 3, 5, 7) if kind == "dense" else (6, 3))
    assert _same(_pixels(store.batch(idx, device)), want)
    picked = store.select(idx)
    assert len(picked) == 4 and _same(_pixels(picked.batch(torch.arange(4), device)), want)
    packed = picked.compact()
    assert packed.nbytes < store.nbytes  # these images' bytes only, not views of the whole buffer
    assert _same(_pixels(packed.batch(torch.arange(4), device)), want)
    for storage in ("device", "pinned", "mmap"):
        placed = store.placed(storage, device)
        assert placed.kind == kind and _same(_pixels(placed.batch(idx.to(placed.device), device)), want)
    assert store.batch(idx, device).device.type == device.type


@pytest.mark.parametrize("kind", KINDS)
def test_placed_keeps_encoded_bytes_on_the_host_and_copies_the_others_to_the_device_tier(kind, device):
    store = _store(kind)
    on_device = store.placed("device", device)
    assert on_device.device.type == ("cpu" if kind == "jpeg" else device.type)
    mmap = store.placed("mmap", device)  # as it is, except encoded bytes: pinned for a GPU's decoder
    assert (mmap is store) == (kind != "jpeg" or device.type == "cpu")
    pinned = store.placed("pinned", device)  # page-locked for a GPU only
    assert pinned.device.type == "cpu" and (pinned is store) == (device.type == "cpu")


@pytest.mark.parametrize("kind", KINDS)
def test_arrays_and_from_arrays_round_trip_and_through_a_cache_entry(kind, tmp_path):
    store, images = _store(kind), _images(kind)
    arrays, meta = store.arrays()
    assert meta["store"] == kind
    back = from_arrays(meta["store"], {**arrays, "labels": torch.arange(6)}, meta)
    assert type(back) is type(store) and _same(_pixels(back.batch(torch.arange(6), torch.device("cpu"))), images)

    write_cache(tmp_path / "entry", "k" * 40, {**arrays, "labels": torch.arange(6)}, dict(meta))
    cache = open_cache(tmp_path / "entry")
    assert cache.store.kind == kind and cache.labels.tolist() == list(range(6))
    assert _same(_pixels(cache.store.batch(torch.arange(6), torch.device("cpu"))), images)
    # .images as gpufeed.open_cache gave it: the tensor of a dense entry, the store of a folder's
    assert isinstance(cache.images, torch.Tensor) if kind == "dense" else cache.images is cache.store


@pytest.mark.parametrize("kind", KINDS)
def test_an_entry_whose_arrays_do_not_fit_its_kind_is_a_cache_error_naming_it(kind, tmp_path):
    # the cache maps whatever arrays its manifest lists; the store of the entry's kind checks they fit together
    arrays, meta = _store(kind).arrays()
    broken = {**arrays, "labels": torch.arange(5)}  # one label short of the six images
    write_cache(tmp_path / "short", "k" * 40, broken, dict(meta))
    want = "do not form a dataset" if kind == "dense" else "index arrays do not fit its"
    with pytest.raises(CacheError, match=f"short: .*{want}.*gpufeed cache clear"):
        open_cache(tmp_path / "short")
    name = next(iter(arrays))
    write_cache(
        tmp_path / "missing",
        "k" * 40,
        {**{k: v for k, v in arrays.items() if k != name}, "labels": torch.arange(6)},
        dict(meta),
    )
    with pytest.raises(CacheError, match=f"lists no '{name}' array"):
        open_cache(tmp_path / "missing")
    write_cache(tmp_path / "other", "k" * 40, {**arrays, "labels": torch.arange(6)}, {**meta, "store": "webp"})
    with pytest.raises(CacheError, match="store kind 'webp' is not one gpufeed writes \\(dense, pixels, jpeg\\)"):
        open_cache(tmp_path / "other")


def test_sample_bytes_are_what_one_sample_takes_decoded():
    assert _store("dense").sample_bytes == 3 * 5 * 7
    decoded = sum(3 * h * w for h, w in SIZES) / 6
    assert _store("pixels").sample_bytes == decoded and _store("jpeg").sample_bytes == decoded


def test_a_folders_pixel_store_and_its_encoded_store_have_one_fingerprint_and_layouts_say_what_they_hold():
    idx = torch.tensor([0, 5])
    pixels, encoded = _store("pixels"), _store("jpeg")
    assert _same(pixels.fingerprint(idx), encoded.fingerprint(idx))
    assert _store("dense").describe() == ""
    assert pixels.describe() == "ragged: 6 images of 3 channel(s), heights 3-9, widths 4-9"
    assert encoded.describe().startswith("encoded files: 6 images decoding to 3 channels, heights 3-9, widths 4-9;")


def test_as_store_wraps_arrays_and_passes_stores_through():
    tensor = torch.zeros(2, 1, 3, 3, dtype=torch.uint8)
    assert isinstance(as_store(tensor), Dense) and as_store(tensor).images is tensor
    assert as_store(np.zeros((2, 1, 3, 3), dtype=np.uint8)).stored_shape == (2, 1, 3, 3)
    ragged = _store("pixels")
    assert as_store(ragged) is ragged and ragged.images is ragged


@pytest.mark.parametrize(
    ("store", "message"),
    [
        (Dense(torch.zeros(2, 3, 4, dtype=torch.uint8)), "images must have shape (N, C, H, W), got (2, 3, 4)"),
        (Ragged.stack([torch.zeros(3, 2, 2, dtype=torch.uint8), torch.zeros(3, 0, 2, dtype=torch.uint8)]),
         "ragged image 1 has shape (3, 0, 2)"),
        (Ragged.stack([torch.zeros(1, 2, 2), torch.zeros(1, 2, 2)]).select(torch.tensor([], dtype=torch.long)),
         "0 ragged images"),
    ],
    ids=["dense of three axes", "an image with no rows", "no images"],
)  # fmt: skip
def test_what_cannot_be_served_is_a_data_error(store, message):
    with pytest.raises(DataError) as e:
        store.check()
    assert message in str(e.value)
