"""What ``gpufeed diagnose`` finds of a loader over a Hugging Face ``datasets.Dataset`` (gpufeed.watch.hf) and the
change it writes (gpufeed.watch.advice): the recipe a ``set_transform`` function applies, however the function
reaches it, its name where the loader is built, the collate function judged, the batch's layout kept by
``batch_keys=``. In process, on datasets built locally; the end-to-end run of a script is in test_verify.py."""

from __future__ import annotations

import functools
import io
import sys

import numpy as np
import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
from PIL import Image

import gpufeed as gf
from gpufeed.errors import ConfigError
from gpufeed.read import hf as read_hf
from gpufeed.watch import hf
from gpufeed.watch.advice import rewrite
from gpufeed.watch.record import LoaderRecord

datasets = pytest.importorskip("datasets")

RECIPE = T.Compose([T.RandomResizedCrop(16), T.ToTensor(), T.Normalize([0.5] * 3, [0.5] * 3)])
OTHER = T.Compose([T.Resize(20), T.CenterCrop(16), T.ToTensor()])


def _dataset(n: int = 12, images: tuple[str, ...] = ("image",)) -> datasets.Dataset:
    rng = np.random.default_rng(0)

    def png() -> dict[str, object]:
        out = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(out, "PNG")
        return {"bytes": out.getvalue(), "path": None}

    columns: dict[str, list[object]] = {k: [png() for _ in range(n)] for k in images}
    columns["label"] = [i % 2 for i in range(n)]
    features = {k: datasets.Image() for k in images} | {"label": datasets.ClassLabel(names=["cat", "dog"])}
    return datasets.Dataset.from_dict(columns, features=datasets.Features(features))


def preprocess(batch):  # the recipe named as a global
    batch["pixel_values"] = [RECIPE(im.convert("RGB")) for im in batch["image"]]
    return batch


def _with_default(batch, tf=OTHER):
    return {"pixel_values": [tf(im) for im in batch["image"]]}


def _closure(tf):
    def apply(batch):
        return {"pixel_values": [tf(im) for im in batch["image"]]}

    return apply


def _helper(batch):  # a function of the script's own that calls another
    return preprocess(batch)


class _Preprocess:
    def __init__(self, tf):
        self.tf = tf

    def __call__(self, batch):
        return {"pixel_values": [self.tf(im) for im in batch["image"]]}

    def method(self, batch):
        return self(batch)


def _partial(batch, tf):
    return {"pixel_values": [tf(im) for im in batch["image"]]}


@pytest.mark.parametrize(
    "fn, name, obj",
    [
        (preprocess, "RECIPE", RECIPE),
        (_with_default, "tf", OTHER),
        (_closure(OTHER), "tf", OTHER),
        (_helper, "RECIPE", RECIPE),
        (_Preprocess(OTHER), "self.tf", OTHER),
        (_Preprocess(OTHER).method, "self.tf", OTHER),
        (functools.partial(_partial, tf=OTHER), "partial argument", OTHER),
        (lambda b: {"x": [RECIPE(im) for im in b["image"]]}, "RECIPE", RECIPE),  # inside a comprehension's code
    ],
    ids=["global", "default", "closure", "helper", "object", "method", "partial", "lambda"],
)
def test_the_recipe_a_function_applies_is_found_however_it_reaches_it(fn, name, obj) -> None:
    recipes, others = hf.recipes_of(fn)
    assert recipes == [(name, obj)] and others == []


def test_parts_of_a_recipe_count_once_and_two_recipes_or_a_callable_of_its_own_are_told_apart() -> None:
    normalize = RECIPE.transforms[-1]
    assert hf.recipes_of(lambda b: (RECIPE(b), normalize(b)))[0] == [("RECIPE", RECIPE)]
    assert [n for n, _ in hf.recipes_of(lambda b: (RECIPE(b), OTHER(b)))[0]] == ["RECIPE", "OTHER"]
    own = _Own()
    recipes, others = hf.recipes_of(lambda b: own(b))
    assert recipes == [] and others == [("own", own)]


class _Own:
    def __call__(self, x):
        return x


OWN = _Own()  # a callable of the script's own, not a recipe


def test_the_recipe_is_named_as_the_frame_that_built_the_loader_names_it() -> None:
    train_tf = OTHER

    class Module:
        def __init__(self):
            self.augment = RECIPE

    holder = Module()
    frame = sys._getframe()
    assert hf.name_at(frame, train_tf) == "train_tf"  # a local before a global (OTHER)
    assert hf.name_at(frame, RECIPE) == "RECIPE"
    frame_locals = {"self": holder}
    assert hf.name_at(type("F", (), {"f_locals": frame_locals, "f_globals": {}})(), RECIPE) == "self.augment"
    assert hf.name_at(frame, object()) is None and hf.name_at(None, RECIPE) is None


def _stack(rows):
    return {
        "pixel_values": torch.stack([r["pixel_values"] for r in rows]),
        "labels": torch.tensor([r["label"] for r in rows]),
    }


def _pad(rows):
    return torch.nn.utils.rnn.pad_sequence([r["ids"] for r in rows])


def test_a_collate_function_that_only_stacks_fields_is_told_from_one_that_does_more() -> None:
    from torch.utils.data import default_collate

    assert hf.collate_why(None) is None and hf.collate_why(default_collate) is None and hf.collate_why(_stack) is None
    assert (
        hf.collate_why(_pad) == "collate_fn=_pad does more than stack the fields: it uses nn, utils, rnn, pad_sequence"
    )
    assert hf.collate_why(_Own()) == "collate_fn is a _Own, which shapes each batch in Python"


def test_the_first_batch_layout_names_the_images_and_the_labels() -> None:
    batch = {"pixel_values": torch.zeros(2, 3, 4, 4), "labels": torch.tensor([0, 1]), "mask": torch.ones(2).bool()}
    assert hf.batch_layout(batch, torch.Tensor) == {
        "kind": "dict", "keys": ["pixel_values", "labels", "mask"], "images": "pixel_values", "labels": "labels",
    }  # fmt: skip
    assert hf.batch_layout((torch.zeros(2, 3, 4, 4), torch.zeros(2)), torch.Tensor) == {"kind": "tuple", "length": 2}
    assert hf.batch_layout(torch.zeros(2), torch.Tensor) == {"kind": "tensor"}


def test_the_hooks_own_checks_agree_with_gpufeed_read_hf() -> None:
    ds = _dataset(4)
    shaped = ds.with_transform(preprocess)
    splits = datasets.DatasetDict({"train": ds})
    for obj in (ds, shaped, splits, ds.to_iterable_dataset(), torch.utils.data.TensorDataset(torch.zeros(2))):
        assert hf.is_hf_dataset(obj) == (read_hf.hf_kind(obj) == "Dataset")
        assert hf._transform_of(obj) is read_hf.transform_of(obj)
    assert hf._transform_of(shaped) is preprocess
    from gpufeed.read.hf_columns import LABEL_NAMES

    assert hf._LABEL_NAMES == LABEL_NAMES
    names = ds.cast_column("label", datasets.Value("int64")).map(lambda r: {"label": "abc"[r["label"] % 3]})
    assert hf._columns(names, set())[:2] == ("image", "label") == (read_hf.arrow_images(names).image_key, "label")


def test_what_is_found_of_a_dataset_with_a_set_transform_function() -> None:
    ds = _dataset(6)
    ds.set_transform(preprocess)
    train_tf = RECIPE  # the script's name for it, where the loader is built
    found = hf.hf_found(ds, _stack, sys._getframe())
    assert found is not None
    assert (found["function"], found["recipe"], found["why"], found["collate"]) == (
        "preprocess",
        "train_tf",
        None,
        None,
    )
    assert (found["image"], found["label"], found["image_key"], found["label_key"]) == ("image", "label", False, False)
    assert found["columns"] == ["image", "label"] and found["recipe_text"].startswith("Compose( RandomResizedCrop")
    assert hf.accelerate_kwargs(ds) == {"transform": RECIPE} and train_tf is RECIPE
    assert hf.hf_found(torch.utils.data.TensorDataset(torch.zeros(2)), None, None) is None

    plain = hf.hf_found(_dataset(2), None, sys._getframe())
    assert plain is not None and plain["function"] is None and plain["why"] is None

    own = _dataset(2).with_transform(lambda b: {"x": [OWN(im) for im in b["image"]]})
    found = hf.hf_found(own, None, sys._getframe())
    assert found is not None and found["recipe"] is None and "not a torchvision or timm transform" in found["why"]
    assert hf.accelerate_kwargs(own) == {}


def _two_images(batch):
    return {"pixel_values": [RECIPE(im) for im in batch["right"]]}


def test_of_several_image_columns_the_one_the_function_reads_is_named() -> None:
    ds = _dataset(4, images=("left", "right")).with_transform(_two_images)
    found = hf.hf_found(ds, None, sys._getframe())
    assert found is not None and (found["image"], found["image_key"]) == ("right", True)
    assert hf.accelerate_kwargs(ds) == {"transform": RECIPE, "image_key": "right"}


def _record(source: str, hf_found: dict, collate: str | None = "__main__.collate_fn") -> LoaderRecord:
    return LoaderRecord(
        0, "DataLoader", "train.py:9", source, "Dataset", None, 32, 2, False, False, 2, "RandomSampler", False,
        shuffle=True, batch_sampler=None, collate_fn=collate, hf=hf_found,
    )  # fmt: skip


_FOUND = {
    "function": "preprocess", "recipe": "train_tf", "recipe_text": "Compose(...)", "why": None,
    "columns": ["image", "label"], "image": "image", "label": "label", "image_key": False, "label_key": False,
    "collate": None,
    "batch": {"kind": "dict", "keys": ["pixel_values", "labels"], "images": "pixel_values", "labels": "labels"},
}  # fmt: skip


def test_the_change_passes_the_recipe_keeps_the_dicts_and_drops_a_stacking_collate() -> None:
    source = "DataLoader(ds, batch_size=32, shuffle=True, collate_fn=collate_fn, num_workers=4)"
    change, why = rewrite(_record(source, _FOUND))
    assert why is None and change is not None
    assert change.new == (
        "gf.accelerate(ds, batch_size=32, shuffle=True, transform=train_tf, batch_keys=('pixel_values', 'labels'))"
    )
    assert change.notes == [
        "gf.accelerate decodes the column 'image' to RGB, reads the labels from 'label' and runs train_tf batched in "
        "place of the dataset's preprocess (the batches stay dicts with the keys 'pixel_values', 'labels')"
    ]
    inline = rewrite(_record("DataLoader(train.with_transform(preprocess), batch_size=32, shuffle=True)", _FOUND))[0]
    assert inline is not None and inline.new.startswith("gf.accelerate(train, batch_size=32, shuffle=True, transform=")


def test_the_change_names_columns_and_labels_as_the_loop_reads_them() -> None:
    source = "DataLoader(ds, batch_size=32, collate_fn=collate_fn)"
    alone = {**_FOUND, "image": "right", "image_key": True,
             "batch": {"kind": "dict", "keys": ["pixel_values"], "images": "pixel_values", "labels": None}}  # fmt: skip
    change = rewrite(_record(source, alone))[0]
    assert change is not None and change.new == (
        "gf.accelerate(ds, batch_size=32, shuffle=False, transform=train_tf, image_key='right', label_key=None, "
        "batch_keys=('pixel_values',))"
    )
    tuples = {**_FOUND, "label": "fine", "label_key": True, "batch": {"kind": "tuple", "length": 2}}
    change = rewrite(_record(source, tuples, collate=None))[0]
    assert change is not None
    assert change.new == "gf.accelerate(ds, batch_size=32, shuffle=False, transform=train_tf, label_key='fine')"


def test_no_change_when_the_recipe_is_not_found_or_the_batches_are_more_than_images_and_labels() -> None:
    source = "DataLoader(ds, batch_size=32, collate_fn=collate_fn)"
    hidden = {**_FOUND, "recipe": None, "why": "preprocess names no torchvision or timm transform"}
    assert rewrite(_record(source, hidden)) == (
        None,
        "the dataset's set_transform function preprocess cannot be replaced by a recipe: preprocess names no "
        "torchvision or timm transform",
    )
    padded = {**_FOUND, "collate": "collate_fn=collate_fn does more than stack the fields: it uses pad"}
    assert rewrite(_record(source, padded))[1] == (
        "collate_fn=collate_fn does more than stack the fields: it uses pad; gf.accelerate yields the images and "
        "labels alone"
    )
    extra = {**_FOUND, "batch": {**_FOUND["batch"], "keys": ["pixel_values", "labels", "mask"]}}
    assert "the batches are dicts of ['pixel_values', 'labels', 'mask']" in (rewrite(_record(source, extra))[1] or "")
    no_image = {**_FOUND, "image": None}
    assert "no single Image column" in (rewrite(_record(source, no_image))[1] or "")
    triple = {**_FOUND, "batch": {"kind": "tuple", "length": 3}}
    assert rewrite(_record(source, triple))[1] == (
        "the batches are tuples of 3; gf.accelerate yields (images, labels), or the images alone"
    )
    unseen = {**_FOUND, "batch": None}  # the script never took a batch: what its loop reads is not known
    assert "the script took no batch from the loader" in (rewrite(_record(source, unseen))[1] or "")


def test_a_loop_over_bare_image_batches_gets_label_key_none() -> None:
    images = {**_FOUND, "batch": {"kind": "tensor"}}
    change = rewrite(_record("DataLoader(ds, batch_size=32, collate_fn=collate_fn)", images))[0]
    assert change is not None
    assert change.new == "gf.accelerate(ds, batch_size=32, shuffle=False, transform=train_tf, label_key=None)"


def test_batch_keys_serve_the_same_batches_as_dicts() -> None:
    ds = _dataset(12)
    recipe = v2.Compose([v2.ToImage(), v2.Resize((8, 8)), v2.ToDtype(torch.float32, scale=True)])
    common = {"batch_size": 5, "device": "cpu", "progress": False, "cache": False, "transform": recipe}
    tuples = list(gf.accelerate(ds, **common))
    dicts = list(gf.accelerate(ds, **common, batch_keys=("pixel_values", "labels")))
    assert len(dicts) == len(tuples) == 3
    for (x, y), d in zip(tuples, dicts, strict=True):
        assert list(d) == ["pixel_values", "labels"]
        assert torch.equal(d["pixel_values"], x) and torch.equal(d["labels"], y)
    alone = list(gf.accelerate(ds, **common, label_key=None, batch_keys="pixel_values"))
    assert [list(d) for d in alone] == [["pixel_values"]] * 3 and torch.equal(alone[0]["pixel_values"], tuples[0][0])


@pytest.mark.parametrize(
    "keys, said",
    [
        (("pixel_values",), "names 1 parts; this loader's batches are (images, labels)"),
        (("a", "a"), "names one key twice"),
        (("a", "b", "c"), "must name the batch's parts"),
        (3, "must name the batch's parts"),
        (("a", ""), "must name the batch's parts"),
    ],
)
def test_batch_keys_that_do_not_name_the_batches_parts_are_refused(keys, said) -> None:
    ds = torch.utils.data.TensorDataset(torch.zeros(4, 3, 4, 4, dtype=torch.uint8), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ConfigError, match=said.replace("(", r"\(").replace(")", r"\)")):
        gf.accelerate(ds, batch_size=2, device="cpu", progress=False, batch_keys=keys)


scale = OWN  # hf_set_transform.py --variant own, at module level as there: its callable and the function using it
_SCALED = lambda b: {"pixel_values": [scale(im.convert("RGB")) for im in b["image"]], "label": b["label"]}  # noqa: E731


def test_a_set_transform_function_applying_the_scripts_own_callable_gets_the_reason() -> None:
    # what a run of hf_set_transform.py --variant own reported (test_verify ran the script for it: 21 s), found on
    # the dataset in this process: the hook calls hf_found with the frame that built the loader, as here
    ds = _dataset(2)
    ds.set_transform(_SCALED)
    found = hf.hf_found(ds, None, sys._getframe())
    assert found is not None
    found["batch"] = _FOUND["batch"]  # the hook adds the first batch's layout; the reason does not depend on it
    assert rewrite(_record("DataLoader(ds, batch_size=32, shuffle=True)", found, collate=None)) == (
        None,
        f"the dataset's set_transform function <lambda> cannot be replaced by a recipe: <lambda> applies scale (a "
        f"{_Own.__module__}._Own), not a torchvision or timm transform: gf.accelerate splits and batches those "
        "recipes (and gpufeed.augment's ops), not a callable of the script's own",
    )
