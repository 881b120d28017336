"""Bad files in a folder: headers that claim more than the file holds are refused before anything is allocated,
every bad file is found when the store is built and named in one error, or left out with on_error="skip"."""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import pil_loader
from torchvision.transforms.functional import pil_to_tensor

import gpufeed as gf
import gpufeed.cache.partial as partial_module
from gpufeed.read.files import read_files, scan_headers
from gpufeed.store.encoded import Encoded, decode

RECIPE = T.Compose([T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.PILToTensor()])
KW = dict(batch_size=4, device="cpu", progress=False)


def _png_claiming(path: Path, width: int, height: int) -> None:
    """A valid 1x1 PNG whose IHDR (and its CRC) is rewritten to claim width x height: 69 bytes."""
    buf = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buf, "PNG")
    data = bytearray(buf.getvalue())
    ihdr = data[12:29]
    ihdr[4:12] = struct.pack(">II", width, height)
    data[12:29], data[29:33] = ihdr, struct.pack(">I", zlib.crc32(bytes(ihdr)))
    path.write_bytes(bytes(data))


def _folder(root: Path, n: int = 12) -> Path:
    rng = np.random.default_rng(1)
    for i in range(n):
        d = root / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (20 + i, 24 + 2 * i, 3), dtype=np.uint8)).save(d / f"{i:02d}.jpg")
    return root


def _bad_folder(root: Path) -> tuple[Path, list[str]]:
    """Three kinds of bad file among good ones: a JPEG cut after its header (found only by decoding it), a file
    that is no image, and a 69-byte PNG whose header claims 9000 x 9000."""
    _folder(root)
    cut = root / "c1" / "04.jpg"
    data = cut.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])  # header intact: only a decode finds it
    (root / "c0" / "junk.jpg").write_bytes(b"not an image at all")
    _png_claiming(root / "c2" / "bomb.png", 9000, 9000)
    return root, sorted(str(p) for p in (cut, root / "c0" / "junk.jpg", root / "c2" / "bomb.png"))


def test_a_png_whose_header_claims_more_pixels_than_its_bytes_hold_is_refused_by_its_header(tmp_path):
    _folder(tmp_path, 3)
    bomb = tmp_path / "c0" / "bomb.png"
    _png_claiming(bomb, 9000, 9000)
    assert bomb.stat().st_size == 69
    shapes, bad = scan_headers(ImageFolder(str(tmp_path)), progress=False)
    (i,) = bad
    assert "bomb.png: its header says 9000 x 9000 pixels, but 69 bytes cannot hold them" in bad[i]
    assert shapes[i].tolist() == [3, 0, 0] and int(shapes.prod(1).sum()) < 10_000  # nothing of its size is counted


def test_the_refused_header_allocates_no_progress_file_and_leaves_nothing(tmp_path, monkeypatch):
    folder = _folder(tmp_path / "data", 3)
    _png_claiming(folder / "c1" / "bomb.png", 9000, 9000)
    sizes: list[int] = []
    real = partial_module.Partial.open.__func__

    def counted(cls, target, key, nbytes, images, source=""):
        sizes.append(nbytes)
        return real(cls, target, key, nbytes, images, source)

    monkeypatch.setattr(partial_module.Partial, "open", classmethod(counted))
    root = tmp_path / "cache"
    ds = ImageFolder(str(folder), transform=RECIPE)
    with pytest.raises(gf.DataError, match=r"bomb\.png: its header says 9000 x 9000 pixels, but 69 bytes"):
        gf.accelerate(ds, cache=root, store="pixels", **KW)
    assert sizes == []  # no progress file was even asked for (it was 232 MiB)
    assert not [p for p in root.iterdir() if p.name.endswith(".partial")]


@pytest.mark.parametrize(
    "make",
    [
        lambda p: Image.new("1", (4000, 4000), 1).save(p / "flat.png"),  # deflate at its best: 1 bit per pixel
        lambda p: Image.new("RGB", (2000, 1600), (255, 255, 255)).save(p / "flat.png"),
        lambda p: Image.new("RGB", (2000, 1600), (255, 255, 255)).save(p / "flat.jpg", quality=1),
        lambda p: Image.new("L", (2000, 1600), 0).save(p / "flat.jpg", quality=1, progressive=True),
    ],
    ids=["1-bit png", "white png", "white jpeg q1", "black progressive gray jpeg"],
)
def test_the_most_compressible_real_images_pass_the_header_check(tmp_path, make):
    (tmp_path / "c").mkdir()
    make(tmp_path / "c")
    shapes, bad = scan_headers(ImageFolder(str(tmp_path)), progress=False)
    assert bad == {} and shapes[0, 1:].tolist() in ([4000, 4000], [1600, 2000])


@pytest.mark.parametrize("store", ["pixels", "jpeg"])
def test_every_bad_file_is_named_in_one_error_when_the_store_is_built(tmp_path, store):
    root, bad = _bad_folder(tmp_path / "data")
    ds = ImageFolder(str(root), transform=RECIPE)
    with pytest.raises(gf.DataError) as e:
        gf.accelerate(ds, cache=False, store=store, **KW)  # raised here, not after some batches of training
    message = str(e.value)
    assert message.startswith(f"3 of {len(ds.samples)} files of ImageFolder at {root} cannot be used:")
    assert all(path in message for path in bad) and "on_error='skip'" in message


def test_read_files_names_every_unreadable_file_at_once(tmp_path):
    root, bad = _bad_folder(tmp_path)
    with pytest.raises(gf.DataError) as e:
        read_files(ImageFolder(str(root)), progress=False)
    # the cut JPEG has a whole header: reading finds the other two, the store's decode the third
    assert [p for p in bad if p in str(e.value)] == [p for p in bad if not p.endswith("04.jpg")]


def test_a_pixel_build_that_fails_on_bad_files_leaves_no_progress_file(tmp_path):
    root, _ = _bad_folder(tmp_path / "data")
    (root / "c0" / "junk.jpg").unlink()
    (root / "c2" / "bomb.png").unlink()  # left: the cut JPEG, found only by decoding it into the progress file
    cache = tmp_path / "cache"
    with pytest.raises(gf.DataError, match=r"(?s)1 of 12 files .*04\.jpg"):
        gf.accelerate(ImageFolder(str(root), transform=RECIPE), cache=cache, store="pixels", **KW)
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == []


def _stored_images(images: object) -> list[torch.Tensor]:
    if isinstance(images, Encoded):
        images = decode(images, torch.device("cpu"))
    return [images.image(i) for i in range(len(images))]


@pytest.mark.parametrize("store", ["pixels", "jpeg"])
def test_on_error_skip_leaves_the_bad_files_out_with_one_warning_and_keeps_labels_with_images(tmp_path, store):
    root, bad = _bad_folder(tmp_path / "data")
    ds = ImageFolder(str(root), transform=RECIPE)
    good = [(p, t) for p, t in ds.samples if p not in bad]
    cache = tmp_path / "cache"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = gf.accelerate(ds, cache=cache, store=store, on_error="skip", **KW)
    skipped = [w for w in caught if "on_error='skip'" in str(w.message)]
    assert len(skipped) == 1 and all(p in str(skipped[0].message) for p in bad)
    assert f"on_error='skip': 3 of {len(ds.samples)} files left out" in " ".join(loader.plan.notes)
    assert loader.labels.tolist() == [t for _, t in good]
    for image, (path, _) in zip(_stored_images(loader.images), good, strict=True):
        assert torch.equal(image, pil_to_tensor(pil_loader(path)))
    assert sum(len(y) for _, y in loader) == len(good)

    # The entry records what it left out: served again with the same warning, and refused under on_error="error"
    with pytest.warns(UserWarning, match="on_error='skip' left out 3 of"):
        again = gf.accelerate(ds, cache=cache, store=store, on_error="skip", **KW)
    assert again.plan.ingest.startswith("cache hit") and again.labels.tolist() == loader.labels.tolist()
    with pytest.raises(gf.DataError, match=r"3 of 14 files .*cannot be used") as e:
        gf.accelerate(ds, cache=cache, store=store, **KW)
    assert all(p in str(e.value) for p in bad)


def test_a_resumed_pixel_build_still_names_the_bad_files_of_the_part_done_before(tmp_path):
    target = tmp_path / "entry"
    first = partial_module.Partial.open(target, "key", 100, 4, "folder")
    first.commit(2, {1: "sample 1 (x.jpg) cannot be decoded"})  # then the build is killed
    resumed = partial_module.Partial.open(target, "key", 100, 4, "folder")
    assert (resumed.done, resumed.bad) == (2, {1: "sample 1 (x.jpg) cannot be decoded"})


def test_on_error_skip_is_refused_where_no_folder_store_is_built():
    ds = torch.utils.data.TensorDataset(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.arange(4))
    with pytest.raises(gf.ConfigError, match=r"on_error='skip' leaves out the files of a folder"):
        gf.accelerate(ds, transform=T.RandomHorizontalFlip(), on_error="skip", **KW)


def test_a_jpeg_store_decodes_the_folder_to_check_it_once_per_state_of_its_files(tmp_path, monkeypatch):
    # cache="auto" keeps no JPEG entry (the bytes are the files): without a record every start would decode the
    # whole folder again to find the bad files.
    import os

    import gpufeed.pipeline.folder_store as sources

    root = _folder(tmp_path / "data")
    cut = root / "c1" / "04.jpg"
    cut.write_bytes(cut.read_bytes()[:-200])  # header intact: only a decode finds it
    ds = ImageFolder(str(root), transform=RECIPE)
    decoded = []
    real = sources.undecodable
    monkeypatch.setattr(sources, "undecodable", lambda enc, *a: decoded.append(len(enc)) or real(enc, *a))

    def start(**kw):
        with pytest.warns(UserWarning, match=f"(?s)on_error='skip'.*{cut}"):
            loader = gf.accelerate(ds, store="jpeg", on_error="skip", **KW, **kw)
        return loader.labels.tolist()

    first = start()
    assert decoded == [12] and first == [t for p, t in ds.samples if p != str(cut)]
    assert start() == first and decoded == [12]  # the files are as they were: the record says which is bad
    st = os.stat(root / "c0" / "00.jpg")
    os.utime(root / "c0" / "00.jpg", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert start() == first and decoded == [12, 12]  # a file changed: checked again
    assert start(cache=False) == first and decoded == [12, 12, 12]  # no disk: nothing recorded or read


def test_the_decode_check_record_is_never_written_into_the_dataset_s_directory(tmp_path):
    from fakes import snapshot

    root = _folder(tmp_path / "data")
    ds = ImageFolder(str(root), transform=RECIPE)
    before = snapshot(root)
    with pytest.warns(UserWarning, match="never writes into a dataset's directory"):
        loader = gf.accelerate(ds, store="jpeg", cache=root / "cache", **KW)  # a cache root inside the folder
    assert sum(len(y) for _, y in loader) == len(ds.samples)
    assert snapshot(root) == before  # no entry, no lock file, no decode record
