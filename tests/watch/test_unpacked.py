"""gpufeed.watch.unpacked: what a loader call's ``*args`` / ``**kwargs`` held, read in the script's frame without
running its code, and the call's arguments by the script's names for them (the change built from the run)."""

from __future__ import annotations

import argparse
import ast
import sys
from typing import Any

import pytest

from gpufeed.watch.advice import code_change, no_change_reason
from gpufeed.watch.record import LoaderRecord
from gpufeed.watch.unpacked import run_value, spread, unpacked_at

_POSITIONAL = ("dataset", "batch_size", "shuffle", "sampler")


def _call(source: str) -> ast.Call:
    return ast.parse(f"(\n{source}\n)", mode="eval").body  # as advice parses a call's source


def _here(source: str, received: Any = None) -> list[dict[str, Any]] | None:
    return unpacked_at(sys._getframe(1), source, received)


def _evaluated(args: dict[str, str], scope: dict[str, Any]) -> dict[str, Any]:
    """Each argument's text evaluated where the call was: what the changed line would pass."""
    return {name: eval(text, {}, scope) for name, text in args.items()}  # noqa: S307 - the test's own texts


def test_the_mnist_examples_train_kwargs_become_its_keys_by_the_scripts_name_and_evaluate_to_the_same_values():
    dataset1 = object()
    train_kwargs = {"batch_size": 64}
    train_kwargs.update({"num_workers": 1, "pin_memory": True, "shuffle": True})
    found = _here("DataLoader(dataset1, **train_kwargs)")
    assert found == [
        {
            "star": "**",
            "expr": "train_kwargs",
            "keys": ["batch_size", "num_workers", "pin_memory", "shuffle"],
            "values": {"batch_size": "64", "num_workers": "1", "pin_memory": "True", "shuffle": "True"},
        }
    ]
    source = "DataLoader(dataset1, **train_kwargs)"
    args, why = spread(source, _call(source), _POSITIONAL, found, {"shuffle": "False"})
    assert why is None and args is not None
    assert args["batch_size"] == "train_kwargs['batch_size']" and args["shuffle"] == "train_kwargs['shuffle']"
    assert _evaluated(args, locals()) == {"dataset": dataset1, **train_kwargs}


def test_a_key_absent_in_this_run_reads_the_dict_with_the_callees_default():
    train_kwargs = {"batch_size": 64}  # on a CPU the example's cuda_kwargs (shuffle=True) are not added
    source = "DataLoader(ds, **train_kwargs)"
    args, _ = spread(source, _call(source), _POSITIONAL, _here(source), {"shuffle": "False"})
    assert args is not None and args["shuffle"] == "train_kwargs.get('shuffle', False)"
    assert eval(args["shuffle"]) is False  # noqa: S307
    train_kwargs["shuffle"] = True  # where the dict holds it (a GPU machine), the same line passes it
    assert eval(args["shuffle"]) is True  # noqa: S307


def test_timms_two_dicts_and_an_attribute_are_each_read_and_named():
    args = argparse.Namespace(loader=dict(num_workers=2), batch_size=16)
    common_loader_kwargs = dict(mean=(0.5,), std=(0.5,), use_prefetcher=False)
    train_loader_kwargs = dict(batch_size=args.batch_size, is_training=True, num_aug_splits=0)
    source = (
        "create_loader(\n    dataset_train,\n    input_size=(3, 32, 32),\n    **common_loader_kwargs,\n"
        "    **train_loader_kwargs,\n    **args.loader,\n)"
    )
    found = _here(source)
    assert [e["expr"] for e in found] == ["common_loader_kwargs", "train_loader_kwargs", "args.loader"]
    named, why = spread(source, _call(source), ("dataset", "input_size", "batch_size"), found)
    assert why is None and named is not None
    assert named["mean"] == "common_loader_kwargs['mean']" and named["num_workers"] == "args.loader['num_workers']"
    assert named["batch_size"] == "train_loader_kwargs['batch_size']" and "shuffle" not in named  # no default given
    dataset_train = None
    scope = {**locals()}
    assert _evaluated(named, scope) == {
        "dataset": None, "input_size": (3, 32, 32), **common_loader_kwargs, **train_loader_kwargs, "num_workers": 2,
    }  # fmt: skip
    assert run_value(found, "use_prefetcher") == "False" and run_value(found, "hflip") is None


def test_starred_positional_arguments_map_to_the_callees_parameters():
    loader_args = (object(), 32)  # noqa: F841 - read by the frame
    source = "DataLoader(*loader_args, shuffle=True)"
    args, why = spread(source, _call(source), _POSITIONAL, _here(source))
    assert why is None and args == {"dataset": "loader_args[0]", "batch_size": "loader_args[1]", "shuffle": "True"}


class _Config:
    def __init__(self) -> None:
        self.kw = {"batch_size": 8}

    @property
    def computed(self) -> dict[str, int]:
        raise AssertionError("a property of the script's own must not run")

    def __getattr__(self, name: str) -> dict[str, int]:
        raise AssertionError("__getattr__ of the script's own must not run")


class _Mapping(dict):
    def keys(self):  # a dict subclass's override is the script's code: dict's own keys are read
        raise AssertionError("must not run")


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("cfg.computed", "_Config.computed is a property (not run)"),
        ("cfg.dynamic", "_Config.dynamic is not a stored attribute"),
        ("make_kwargs()", "call expressions are not evaluated (they may run code)"),
        ("missing", "missing is not defined there"),
        ("cfg", "a _Config, not a dict"),
    ],
)
def test_nothing_of_the_scripts_own_code_runs_and_what_is_not_read_says_why(expr, why):
    cfg, make_kwargs = _Config(), dict  # noqa: F841 - read by the frame
    source = f"DataLoader(ds, **{expr})"
    [entry] = _here(source)
    assert entry["why"] == why and "keys" not in entry
    args, reason = spread(source, _call(source), _POSITIONAL, [entry])
    assert args is None and reason == f"the call passes **{expr}, whose contents were not read: {why}"


def test_a_stored_attribute_and_a_dict_subclass_are_read_without_their_code():
    cfg, sub = _Config(), _Mapping(batch_size=4)  # noqa: F841
    assert _here("DataLoader(ds, **cfg.kw)")[0]["keys"] == ["batch_size"]
    assert _here("DataLoader(ds, **sub)")[0]["keys"] == ["batch_size"]


def test_a_mapping_not_read_is_known_from_what_the_loaders_init_received_when_the_script_called_it():
    cfg = _Config()  # noqa: F841 - cfg.dynamic stands for OmegaConf's DictConfig: a mapping read through __getattr__
    source = "DataLoader(ds, shuffle=True, **cfg.dynamic)"
    [entry] = _here(source, received=((None,), {"shuffle": True, "batch_size": 8, "num_workers": 2}))
    assert entry["keys"] == ["batch_size", "num_workers"] and "why" not in entry
    args, _ = spread(source, _call(source), _POSITIONAL, [entry], {"shuffle": "False"})
    assert args is not None and args["batch_size"] == "cfg.dynamic['batch_size']" and args["shuffle"] == "True"


def _record(source: str, unpacked: Any, **kw: Any) -> LoaderRecord:
    return LoaderRecord(0, "DataLoader", "train.py:9", source, "MNIST", None, 64, 1, True, False, 2,
                        "RandomSampler", False, shuffle=True, batch_sampler=None, collate_fn=None,
                        unpacked=unpacked, **kw)  # fmt: skip


def test_the_change_keeps_the_scripts_names_and_drops_what_gf_accelerate_does_itself():
    train_kwargs = {"batch_size": 64, "num_workers": 1, "pin_memory": True, "shuffle": True, "sampler": None}
    source = "torch.utils.data.DataLoader(dataset1,**train_kwargs)"
    rec = _record(source, _here(source))
    assert no_change_reason(rec) is None
    assert code_change(rec) == (
        "- torch.utils.data.DataLoader(dataset1,**train_kwargs)\n"
        "+ gf.accelerate(dataset1, batch_size=train_kwargs['batch_size'], shuffle=train_kwargs['shuffle'])"
    )
    del train_kwargs


def test_without_the_runs_record_the_reason_says_what_is_missing():
    rec = _record("DataLoader(ds, **kw)", None)
    assert code_change(rec) is None and "was not recorded" in no_change_reason(rec)


_TIMM_CALL = (
    "create_loader(\n    dataset_train,\n    input_size=data_config['input_size'],\n"
    "    input_size_choices=args.train_img_sizes,\n    collate_fn=collate_fn,\n    **common_loader_kwargs,\n"
    "    **train_loader_kwargs,\n)"
)


def _timm_record(**kw: Any) -> LoaderRecord:
    common_loader_kwargs = dict(mean=(0.5,), std=(0.5,), use_prefetcher=True, device="cpu")  # noqa: F841
    train_loader_kwargs = dict(batch_size=16, is_training=True, scale=[0.08, 1.0], num_aug_splits=0)  # noqa: F841
    facts = {"shuffle": True, "batch_sampler": None, "collate_fn": None, "sampler": "RandomSampler", **kw}
    return LoaderRecord(0, "DataLoader", "train.py:9", _TIMM_CALL, "ImageDataset", None, 16, 0, False, False, None,
                        facts.pop("sampler"), True, built_by="timm.data.loader.create_loader",
                        unpacked=_here(_TIMM_CALL), **facts)  # fmt: skip


def test_timms_train_py_loader_gets_its_recipe_from_both_dicts_by_their_names():
    change = code_change(_timm_record())
    assert change is not None and change.splitlines()[-1] == (
        "+ gf.accelerate(dataset_train, batch_size=train_loader_kwargs['batch_size'], "
        "shuffle=train_loader_kwargs['is_training'], drop_last=train_loader_kwargs['is_training'], "
        "transform=timm.data.create_transform(data_config['input_size'], "
        "is_training=train_loader_kwargs['is_training'], "
        "scale=train_loader_kwargs['scale'], mean=common_loader_kwargs['mean'], std=common_loader_kwargs['std']))"
    )


@pytest.mark.parametrize(
    ("facts", "said"),
    [
        ({"batch_sampler": "ScheduledBatchSampler"}, "made the batches with a ScheduledBatchSampler here"),
        ({"shuffle": None, "sampler": "RepeatAugSampler"}, "ordered the samples with a RepeatAugSampler here"),
        ({"collate_fn": "timm.data.mixup.FastCollateMixup"}, "mixes batches (a Mixup collate_fn)"),
    ],
)
def test_what_timms_loader_did_in_the_run_that_gf_accelerate_does_not_is_the_reason(facts, said):
    rec = _timm_record(**facts)
    assert code_change(rec) is None and said in no_change_reason(rec)


def test_a_functools_partial_of_dataloader_is_read_and_the_change_names_its_arguments():
    # make_loader = functools.partial(DataLoader, shuffle=True, drop_last=True, **vars(largs)); make_loader(ds):
    # the call names no DataLoader, the partial holds its arguments (the old reason sent the user to look for a
    # DataLoader(...) "the script made elsewhere")
    import functools

    from torch.utils.data import DataLoader

    largs = argparse.Namespace(batch_size=16, num_workers=2)
    make_loader = functools.partial(DataLoader, shuffle=True, drop_last=True, **vars(largs))
    source = "make_loader(datasets.ImageFolder(args.data, transform=tf))"
    found = _here(source, received=((object(),), dict(make_loader.keywords)))
    assert found == [
        {
            "star": "partial",
            "expr": "make_loader",
            "func": "torch.utils.data.dataloader.DataLoader",
            "length": 0,
            "keys": ["shuffle", "drop_last", "batch_size", "num_workers"],
            "values": {"shuffle": "True", "drop_last": "True", "batch_size": "16", "num_workers": "2"},
        }
    ]
    rec = _record(source, found)
    assert no_change_reason(rec) is None
    assert code_change(rec) == (
        "- make_loader(datasets.ImageFolder(args.data, transform=tf))\n"
        "+ gf.accelerate(datasets.ImageFolder(args.data, transform=tf), "
        "batch_size=make_loader.keywords['batch_size'], shuffle=make_loader.keywords['shuffle'], "
        "drop_last=make_loader.keywords['drop_last'])"
    )
    ds = object()
    partial_first = functools.partial(DataLoader, ds, 8)  # the dataset and batch size held, the call adds shuffle=
    source = "partial_first(shuffle=flag)"
    found = _here(source, received=((ds, 8), {"shuffle": True}))
    assert found[0]["length"] == 2 and found[0]["keys"] == []
    assert code_change(_record(source, found)).splitlines()[-1] == (
        "+ gf.accelerate(partial_first.args[0], batch_size=partial_first.args[1], shuffle=flag)"
    )
    del largs, make_loader, partial_first
