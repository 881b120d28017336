"""A Hugging Face Hub repository on disk (gpufeed.mds.hub): its splits found as ``datasets.load_dataset`` finds them,
from the card's ``configs`` or the files' names, and every row of a split the row ``load_dataset`` gives (label and
image bytes). Repositories are built in ``tmp_path``: nothing reaches the Hub."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gpufeed.errors import ConfigError, DataError
from gpufeed.mds.hf import locate, open_dataset

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

NAMES = ["cat", "dog", "owl"]
FEATURES_YAML = """dataset_info:
  features:
  - name: image
    dtype: image
  - name: label
    dtype:
      class_label:
        names:
          '0': cat
          '1': dog
          '2': owl
"""


def _jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (8 + seed % 5, 9 + seed % 3, 3), dtype=np.uint8)).save(out, "JPEG")
    return out.getvalue()


def _table(first: int, n: int) -> pa.Table:
    """``n`` rows from ``first`` on: an Image column's storage (struct<bytes, path>) and int64 labels, no Hugging Face
    metadata (as files written by other tools): the card's ``dataset_info`` says what they are."""
    images = pa.array([{"bytes": _jpeg(first + i), "path": None} for i in range(n)])
    return pa.table({"image": images, "label": pa.array([(first + i) % 3 for i in range(n)], pa.int64())})


def _write(path: Path, first: int, n: int, fmt: str = "parquet") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = _table(first, n)
    if fmt == "parquet":
        pq.write_table(table, path, row_group_size=4)
    else:  # the Arrow IPC stream format, as datasets writes it
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=4)


def _card(repo: Path, configs: str, features: bool = True) -> None:
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "README.md").write_text(f"---\n{configs}{FEATURES_YAML if features else ''}---\n# A dataset\n")


def _rows(ds: datasets.Dataset) -> list[tuple[bytes, int]]:
    raw = ds.cast_column("image", datasets.Image(decode=False))
    return [(r["image"]["bytes"], r["label"]) for r in raw]


def _loaded(repo: Path, tmp_path: Path, **kw: object) -> datasets.DatasetDict:
    return datasets.load_dataset(str(repo), cache_dir=str(tmp_path / "hf-cache"), **kw)


def _same_as_load_dataset(repo: Path, tmp_path: Path, config: str | None = None) -> dict:
    """Every split of ``repo`` (a repository, or any folder of files) as gpufeed reads it, against
    ``load_dataset(repo)``'s: the same splits, features and rows in order; returns the split sizes."""
    want = _loaded(repo, tmp_path, **({"name": config} if config else {}))
    where = locate(repo, config)
    assert where is not None and list(where.splits) == list(want), (where.splits, list(want))
    for split in want:
        got = open_dataset(where, split)
        assert got.features["label"] == want[split].features["label"], split
        assert _rows(got) == _rows(want[split]), split
    return {split: len(want[split]) for split in want}


SHARDED = """configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*
  - split: test
    path: data/test-*
"""


def _sharded(repo: Path, train: tuple[int, ...] = (40, 24), test: int = 16, fmt: str = "parquet") -> None:
    """``data/train-0000k-of-0000n.{fmt}`` shards and ``data/test-00000-of-00001.{fmt}``, as push_to_hub writes."""
    first = 0
    for k, n in enumerate(train):
        _write(repo / "data" / f"train-{k:05d}-of-{len(train):05d}.{fmt}", first, n, fmt)
        first += n
    _write(repo / "data" / f"test-00000-of-00001.{fmt}", first, test, fmt)


def test_a_repository_and_its_data_folder_are_split_by_the_card_as_load_dataset_splits_them(tmp_path: Path) -> None:
    repo = tmp_path / "pets"
    _card(repo, SHARDED)
    _sharded(repo)
    assert _same_as_load_dataset(repo, tmp_path) == {"train": 64, "test": 16}  # the 80 rows, split
    where = locate(repo)
    assert where is not None and where.layout is not None and where.layout.config == "default"
    assert open_dataset(where).features["label"].names == NAMES  # the card's ClassLabel, as load_dataset casts
    assert _same_as_load_dataset(repo / "data", tmp_path) == {"train": 64, "test": 16}  # by the files' names
    # a card's lists of paths and globs, and split names of its own
    listed = "configs:\n- config_name: main\n  data_files:\n  - split: train\n    path:\n    - part/a-*.parquet\n" \
             "    - part/b.parquet\n  - split: holdout\n    path: part/c.parquet\n"  # fmt: skip
    other = tmp_path / "listed"
    _card(other, listed)
    _write(other / "part" / "a-1.parquet", 0, 5)
    _write(other / "part" / "a-0.parquet", 5, 3)
    _write(other / "part" / "b.parquet", 8, 4)
    _write(other / "part" / "c.parquet", 12, 6)
    _write(other / "part" / "ignored.parquet", 18, 2)  # named by no pattern
    assert _same_as_load_dataset(other, tmp_path) == {"train": 12, "holdout": 6}


@pytest.mark.parametrize(
    "files",
    [
        {"train.parquet": 7, "validation.parquet": 3, "test.parquet": 4},
        {"my_train-1.parquet": 5, "my_train-0.parquet": 4, "dev.parquet": 3, "eval_set.parquet": 2},
        {"data/train/b.parquet": 4, "data/train/a.parquet": 5, "data/test/c.parquet": 3},
        {
            "data/train-00000-of-00002.parquet": 6,
            "data/train-00001-of-00002.parquet": 2,
            "data/validation-00000-of-00001.parquet": 3,
        },
        {"part-0.parquet": 5, "part-1.parquet": 4},
        {"data/train-00000-of-00001.arrow": 9, "data/test-00000-of-00001.arrow": 5},
        {"default/train/0000.parquet": 6, "default/test/0000.parquet": 2, "notes.txt": 0},
    ],
    ids=["root-names", "keywords", "split-folders", "sharded", "no-split-names", "arrow", "parquet-branch"],
)
def test_without_a_card_config_the_file_names_split_it_as_load_dataset_does(tmp_path: Path, files: dict) -> None:
    repo = tmp_path / "repo"
    first = 0
    for name, n in files.items():
        if name.endswith(".txt"):
            (repo / name).write_text("not data")
            continue
        _write(repo / name, first, n, "arrow" if name.endswith(".arrow") else "parquet")
        first += n
    sizes = _same_as_load_dataset(repo, tmp_path)
    assert sum(sizes.values()) == first and "train" in sizes
    if (repo / "data").is_dir():  # the data folder itself reads the same way
        assert _same_as_load_dataset(repo / "data", tmp_path) == sizes


def test_a_card_without_configs_splits_by_the_file_names_and_its_features_apply(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _card(repo, "")  # dataset_info only
    _sharded(repo, (5,), 3)
    assert _same_as_load_dataset(repo, tmp_path) == {"train": 5, "test": 3}
    assert open_dataset(locate(repo)).features["label"].names == NAMES


def test_several_configs_and_no_default_are_refused_naming_them_and_each_reads_when_picked(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    configs = "configs:\n" + "".join(
        f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {c}/train-*\n  - split: test\n"
        f"    path: {c}/test-*\n"
        for c in ("small", "large")
    )
    _card(repo, configs)
    for c, n in (("small", 4), ("large", 9)):
        _write(repo / c / "train-00000-of-00001.parquet", 0, n)
        _write(repo / c / "test-00000-of-00001.parquet", n, 2)
    with pytest.raises(ConfigError) as refused:
        locate(repo)
    message = str(refused.value)
    assert "has the configs ['small', 'large'], none marked default" in message and "--config NAME" in message
    assert f"give a config's folder, e.g. {repo / 'small'}" in message
    assert _same_as_load_dataset(repo, tmp_path, "large") == {"train": 9, "test": 2}
    assert _same_as_load_dataset(repo, tmp_path, "small") == {"train": 4, "test": 2}
    small = locate(repo / "small")  # the config's folder, as the message says: its files split by their names
    assert small is not None and [len(open_dataset(small, s)) for s in small.splits] == [4, 2]
    with pytest.raises(ConfigError, match=r"config='medium': .*README.md has the configs \['small', 'large'\]"):
        locate(repo, "medium")
    with pytest.raises(ConfigError, match=r"config='small' picks a config of a Hub repository's README.md card"):
        locate(repo / "small", "small")
    _card(repo, configs.replace("- config_name: large\n", "- config_name: large\n  default: true\n"))
    assert [len(open_dataset(locate(repo), s)) for s in ("train", "test")] == [9, 2]  # the default one


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ("../outside/*.parquet", "leaves the repository"),
        ("data/../../outside/x.parquet", "leaves the repository"),
        ("/etc/*.parquet", "is not a path inside the repository"),
        ("~/x.parquet", "is not a path inside the repository"),
        ("hf://datasets/someone/else/data/*.parquet", "is not a path inside the repository"),
    ],
)
def test_a_card_path_that_leaves_the_repository_is_refused_naming_the_card_and_entry(
    tmp_path: Path, entry: str, said: str
) -> None:
    repo = tmp_path / "repo"
    _write(tmp_path / "outside" / "x.parquet", 0, 3)
    _write(repo / "data" / "train-0.parquet", 0, 3)
    _card(repo, f"configs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*\n"
                f"  - split: test\n    path: '{entry}'\n")  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        locate(repo)
    message = str(refused.value)
    assert f"{repo / 'README.md'}: config 'default''s data_files of split 'test' {entry!r} {said}" in message
    _card(repo, SHARDED.replace("path: data/test-*", "path: ./data/../data/train-*"))  # a `..` that stays inside
    assert locate(repo).splits == ("train", "test")  # type: ignore[union-attr]


def test_a_card_file_linking_out_of_the_repository_is_refused_and_a_hub_cache_snapshot_is_read(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _write(tmp_path / "elsewhere" / "secret.parquet", 0, 3)
    _card(repo, SHARDED)
    _sharded(repo, (4,), 2)
    os.symlink(tmp_path / "elsewhere" / "secret.parquet", repo / "data" / "train-00001-of-00001.parquet")
    with pytest.raises(ConfigError, match=r"README.md's config 'default', split 'train': .* resolves to .*secret"):
        locate(repo)
    (repo / "README.md").unlink()  # the user's own folder of files: a link there is the user's (load_dataset reads it)
    assert _same_as_load_dataset(repo, tmp_path) == {"train": 7, "test": 2}
    # huggingface_hub's cache: snapshots/REV/ holds links into blobs/, beside it in the repository's folder
    cache = tmp_path / "hub" / "datasets--someone--pets"
    snapshot = cache / "snapshots" / "0123abc"
    _card(snapshot, SHARDED)
    for name, first, n in (("train-00000-of-00001.parquet", 0, 6), ("test-00000-of-00001.parquet", 6, 2)):
        _write(cache / "blobs" / name.replace("-", "")[:12], first, n)
        (snapshot / "data").mkdir(parents=True, exist_ok=True)
        os.symlink(Path("../../../blobs") / name.replace("-", "")[:12], snapshot / "data" / name)
    assert _same_as_load_dataset(snapshot, tmp_path) == {"train": 6, "test": 2}


def test_a_folder_of_images_is_not_a_repository_and_config_is_refused_for_it(tmp_path: Path) -> None:
    (tmp_path / "folder" / "cat").mkdir(parents=True)
    (tmp_path / "folder" / "cat" / "a.jpg").write_bytes(_jpeg(0))
    assert locate(tmp_path / "folder") is None
    with pytest.raises(ConfigError, match="config='x' picks a config of a Hub repository's README.md card"):
        locate(tmp_path / "folder", "x")
    csv = tmp_path / "csv"
    _card(csv, "configs:\n- config_name: default\n  data_files: data/*.csv\n", features=False)
    (csv / "data").mkdir()
    (csv / "data" / "rows.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match=r"its data files are \.csv files \(1\); gpufeed reads a repository of Parq"):
        locate(csv)


def test_file_names_giving_a_split_name_datasets_refuses_are_a_typed_error_naming_them_and_the_card_fix(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    _write(repo / "data" / "train-00000-of-00001.parquet", 0, 5)
    _write(repo / "data" / "test-clean-00000-of-00001.parquet", 5, 3)  # LibriSpeech-style: test-clean
    with pytest.raises(ValueError, match="Split name should match"):
        _loaded(repo, tmp_path)  # load_dataset refuses the name too
    with pytest.raises(ConfigError) as refused:
        locate(repo)
    message = str(refused.value)
    assert f"{repo}: its file names give split names that datasets refuses too" in message, message
    assert "'test-clean'" in message and "a README.md card whose configs name the splits" in message
    assert _same_as_load_dataset(repo / "data", tmp_path) == {"train": 5, "test": 3}  # there, a keyword: test
    # the fix the message gives: a card naming the split, as load_dataset reads it
    _card(repo, "configs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*\n"
                "  - split: test_clean\n    path: data/test-clean-*\n")  # fmt: skip
    assert _same_as_load_dataset(repo, tmp_path) == {"train": 5, "test_clean": 3}


def test_files_datasets_does_not_read_beside_the_data_are_passed_over_as_load_dataset_passes_them(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    _write(repo / "data" / "train-0.parquet", 0, 5)
    _write(repo / "data" / "test-0.parquet", 5, 3)
    for name in ("train-0.lock", "train-1.lock", "test-0.lock", "test-0.md5"):
        (repo / "data" / name).write_text("not data")  # more of them than of the data files
    assert _same_as_load_dataset(repo, tmp_path) == {"train": 5, "test": 3}


def test_splits_of_different_formats_are_refused_naming_each_as_load_dataset_refuses_them(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _write(repo / "train.parquet", 0, 5)
    _write(repo / "test.arrow", 5, 3, "arrow")
    with pytest.raises(ValueError, match="Couldn't infer the same data file format for all splits"):
        _loaded(repo, tmp_path)
    with pytest.raises(ConfigError) as refused:
        locate(repo)  # not train alone, its test split left out without a word
    message = str(refused.value)
    assert f"{repo}: its splits are files of different formats (train: .parquet, test: .arrow)" in message, message
    assert "give the files of one format" in message


def test_a_hub_repository_of_image_files_is_an_image_folder_as_it_was_before_cards_were_read(tmp_path: Path) -> None:
    repo = tmp_path / "pics"  # an imagefolder repository: its card's configs name the images
    _card(repo, "configs:\n- config_name: default\n  data_files:\n  - split: train\n    path: train/**\n"
                "  - split: validation\n    path: val/**\n", features=False)  # fmt: skip
    for split, n in (("train", 4), ("val", 2)):
        for c in ("cat", "dog"):
            (repo / split / c).mkdir(parents=True)
            for i in range(n):
                (repo / split / c / f"{i}.jpg").write_bytes(_jpeg(i))
    assert {k: len(v) for k, v in _loaded(repo, tmp_path).items()} == {"train": 8, "validation": 4}
    assert locate(repo) is None  # not Parquet or Arrow files: read by its folders, as an image folder
    with pytest.raises(ConfigError, match=r"config='default' picks a config of a Hub repository's README.md card"):
        locate(repo, "default")


def _named_rows(path: Path, labels: list) -> None:
    """A Parquet file of ``labels`` as written by another tool: class names as strings, or raw integers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    images = pa.array([{"bytes": _jpeg(i), "path": None} for i in range(len(labels))])
    pq.write_table(pa.table({"image": images, "label": pa.array(labels)}), path)


def test_files_that_do_not_fit_the_cards_class_label_are_read_as_load_dataset_casts_them_or_refused_naming_them(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "names"  # the card's ClassLabel over class names: load_dataset numbers them by its names
    _card(repo, "")
    _named_rows(repo / "data" / "train-00000-of-00001.parquet", ["owl", "cat", "dog", "owl"])
    assert _same_as_load_dataset(repo, tmp_path) == {"train": 4}
    assert open_dataset(locate(repo))["label"] == [2, 0, 1, 2]
    for name, labels, said in (
        ("unknown", ["owl", "bird"], "Invalid string class label bird"),
        ("beyond", [0, 5], "Class label 5 greater than configured num_classes 3"),
    ):
        repo = tmp_path / name
        _card(repo, "")
        _named_rows(repo / "data" / "train-00000-of-00001.parquet", labels)
        with pytest.raises(Exception, match="An error occurred while generating the dataset"):
            _loaded(repo, tmp_path)  # load_dataset refuses them too
        with pytest.raises(DataError) as refused:
            open_dataset(locate(repo))
        message = str(refused.value)
        assert f"{repo} (train split): its files do not fit the features of {repo / 'README.md'}" in message, message
        assert said in message and "fix the files or the card's dataset_info" in message


def test_a_standalone_huggingface_yaml_splits_the_repository_as_load_dataset_reads_it_over_the_card(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"  # the configs in .huggingface.yaml, the features in the card: load_dataset merges both
    _card(repo, "")
    (repo / ".huggingface.yaml").write_text(
        "configs:\n- config_name: default\n  data_files:\n  - split: train\n    path: a/*.parquet\n"
        "  - split: test\n    path: b/*.parquet\n"
    )
    _write(repo / "a" / "x.parquet", 0, 5)
    _write(repo / "b" / "y.parquet", 5, 3)  # read by the file names, both would be train: the test split trained on
    assert _same_as_load_dataset(repo, tmp_path) == {"train": 5, "test": 3}
    where = locate(repo)
    assert where is not None and where.layout is not None and where.layout.how == ".huggingface.yaml's config 'default'"
    assert open_dataset(where).features["label"].names == NAMES


def test_a_hub_cache_repository_folder_is_refused_naming_its_snapshot_not_read_as_every_revision_at_once(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "hub" / "datasets--someone--pets"  # two revisions: load_dataset(cache) reads both as one
    for rev, n in (("0aaa", 4), ("1bbb", 6)):
        for split, k in (("train", n), ("test", 2)):
            blob = cache / "blobs" / f"{rev}{split}"
            _write(blob, 0, k)
            (cache / "snapshots" / rev / "data").mkdir(parents=True, exist_ok=True)
            os.symlink(Path("../../../blobs") / blob.name, cache / "snapshots" / rev / "data" / f"{split}-0.parquet")
    (cache / "refs").mkdir()
    (cache / "refs" / "main").write_text("1bbb")
    assert {k: len(v) for k, v in _loaded(cache, tmp_path).items()} == {"train": 10, "test": 4}  # both revisions
    with pytest.raises(ConfigError) as refused:
        locate(cache)
    message = str(refused.value)
    assert f"{cache}: a Hugging Face cache's folder of a repository" in message, message
    assert f"give its snapshot: {cache / 'snapshots' / '1bbb'}" in message
    assert _same_as_load_dataset(cache / "snapshots" / "1bbb", tmp_path) == {"train": 6, "test": 2}
