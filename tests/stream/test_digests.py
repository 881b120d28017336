"""Every byte that decides what is learned is checked: a flipped bit in a label is refused naming the sample (it was
served as another class: the sha1 covered the image alone); an earlier conversion is still served, with one warning
that its labels are not covered; a dataset without ``gpufeed.json`` is served with one warning and a plan line that
says nothing is checked (NOTE [ What a sample's digests cover ] in ``gpufeed.mds.digests``)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from gpufeed.errors import DataError
from gpufeed.mds.shards import Shards

from .mds import open_photos, write_photos

pytest.importorskip("streaming", reason="gpufeed.stream needs MosaicML Streaming: pip install 'gpufeed[streaming]'")


def _flip(path: Path, offset: int, bit: int = 1) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ bit]))


def _label_offset(shards: Shards, sample: int) -> tuple[Path, int]:
    """The shard file holding ``sample`` and the offset of its label's first byte, from the MDS layout (a uint32
    count, the records' offsets, each record's column sizes then its columns, in the index's column order)."""
    shard, position = (int(v[0]) for v in shards.index.locate([sample]))
    path = Path(shards.local) / shards.index.basenames[shard]
    data = path.read_bytes()
    offsets = np.frombuffer(data, "<u4", int(shards.index.samples_per_shard[shard]) + 1, 4)
    begin, end = int(offsets[position]), int(offsets[position + 1])
    columns = shards.index.columns[shard]
    return path, begin + columns._spans(data[begin:end])[columns.label][0]


@pytest.mark.parametrize("bit, byte, read_as", [(2, 0, 16), (0x80, 7, 18 - 2**63)], ids=["low bit", "sign byte"])
def test_a_flipped_label_bit_is_refused_naming_the_sample_not_served_as_another_class(tmp_path, bit, byte, read_as):
    data = write_photos(tmp_path / "photos", 40, digests=True)
    with Shards(data) as shards:
        assert shards.verify and shards.verify_labels
        path, offset = _label_offset(shards, 18)
    _flip(path, offset + byte, bit)
    with Shards(data) as shards:
        shards.verify_labels = False
        assert shards.read([18]).labels.tolist() == [read_as]  # what was served before: another class
        shards.verify_labels = True
        with pytest.raises(DataError) as refused:
            shards.read([17, 18])
        text = str(refused.value)
        assert text.startswith(f"sample 18 (key 'p00018.jpg', shard {path.name}, position ")
        assert f"its label {read_as} does not match the digest gpufeed convert stored over its image and label" in text
        assert "the image matches its own sha1" in text and f"{path} is corrupt" in text and "not served" in text
        assert shards.read([17, 19]).labels.tolist() == [17, 19]  # the others are served
    loader = open_photos(str(data), shuffle=False)
    ids = loader.epoch_plan(0).ids.tolist()
    served: list[int] = []
    with pytest.raises(DataError, match=r"sample 18 \(key 'p00018.jpg'.*its label"):
        for _, y in loader:
            served += y.tolist()
    assert served == ids[: ids.index(18) // 8 * 8] and read_as not in served


def test_gpufeed_convert_covers_each_label_and_the_reader_checks_it(tmp_path):
    from PIL import Image

    from gpufeed.mds.convert import convert

    src = tmp_path / "src"
    for c in range(3):
        (src / f"c{c}").mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (12, 10), (c * 80, i * 60, 7)).save(src / f"c{c}" / f"{i}.png")
    dst = tmp_path / "dst"
    convert(src, dst, progress=False)
    assert json.loads((dst / "gpufeed.json").read_text())["format"] == "gpufeed.mds/2"
    with Shards(dst) as shards:
        assert shards.verify_labels and shards.read([5]).labels.tolist() == [1]
        path, offset = _label_offset(shards, 5)
    _flip(path, offset)  # label 1 -> 0: a class that exists
    with Shards(dst) as shards, pytest.raises(DataError, match=r"sample 5 \(key 'c1/1.png', .*its label 0 does not"):
        shards.read([5])


def test_an_earlier_conversion_is_served_with_one_warning_that_its_labels_are_not_covered(tmp_path):
    data = write_photos(tmp_path / "photos", 24, digests=True, labels_covered=False)
    with pytest.warns(UserWarning) as said:
        loader = open_photos(str(data))
    texts = [str(w.message) for w in said if "gpufeed convert" in str(w.message)]
    assert len(texts) == 1 and texts[0].startswith(f"{data} was written by an earlier gpufeed convert (gpufeed.mds/1)")
    assert "its label is not covered" in texts[0] and "gpufeed convert SRC DST" in texts[0]
    assert "content: images checked against their sha1, labels not covered (gpufeed.mds/1)" in loader.plan.notes
    assert loader.shards.verify and not loader.shards.verify_labels
    with warnings.catch_warnings(record=True) as again:  # once per dataset in a process
        warnings.simplefilter("always")
        open_photos(str(data))
    assert not [w for w in again if "gpufeed convert" in str(w.message)]


def test_a_dataset_without_gpufeed_json_is_served_with_one_warning_and_a_plan_line(tmp_path):
    data = write_photos(tmp_path / "photos", 24, digests=True)
    own = shutil.copytree(data, tmp_path / "own")
    (own / "gpufeed.json").unlink()
    with pytest.warns(UserWarning, match=rf"{own} has no gpufeed.json: its samples are served without a content check"):
        loader = open_photos(str(own))
    assert "content: not checked (no gpufeed convert digests)" in loader.plan.notes and not loader.shards.verify
    converted = open_photos(str(data))  # a current conversion: no warning needed, and the plan says what is checked
    assert "content: each sample's image and label checked against its digest" in converted.plan.notes


@pytest.mark.parametrize("column, covered", [("sample_sha1", True), ("sha1", True), ("sha1", False)])
def test_a_conversion_whose_index_lost_a_digest_column_is_refused_not_checked_less(tmp_path, column, covered):
    # one shard's column renamed in index.json (its records unchanged): every label (or image) of the dataset was
    # served unchecked, with a warning blaming an earlier gpufeed convert
    data = write_photos(tmp_path / "photos", 40, digests=True, labels_covered=covered)
    index = json.loads((data / "index.json").read_text())
    names = index["shards"][3]["column_names"]
    names[names.index(column)] = "renamed"
    (data / "index.json").write_text(json.dumps(index))
    fmt = "gpufeed.mds/2" if covered else "gpufeed.mds/1"
    with pytest.raises(DataError) as refused:
        Shards(data)
    text = str(refused.value)
    assert text.startswith(f"{data}'s gpufeed.json says {fmt}, whose every shard holds a {column!r} column, but a")
    assert "convert the source again" in text


def test_a_label_that_does_not_fit_int64_is_a_data_error_naming_the_sample(tmp_path):
    # a uint64 label column (a user's own MDS: nothing checks its labels) whose high bit is set, by design or by a
    # flipped bit: a raw OverflowError from numpy, mid-epoch, naming nothing
    from streaming import MDSWriter

    with MDSWriter(out=str(tmp_path / "own"), columns={"image": "bytes", "label": "uint64"}, progress_bar=False) as w:
        for i in range(4):
            w.write({"image": b"\xff\xd8\xff" + bytes([i]) * 50, "label": np.uint64(2**63 + i if i == 2 else i)})
    with Shards(tmp_path / "own") as shards:
        with pytest.raises(DataError, match=r"sample 2 \(shard shard.00000.mds, position 2\) is corrupt: its label 9"):
            shards.read([0, 1, 2])
        assert shards.read([3, 1]).labels.tolist() == [3, 1]
