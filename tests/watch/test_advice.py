"""code_change(): the diff from the call that built the script's loader to gf.accelerate, on real source snippets."""

import ast
import textwrap

import pytest

from gpufeed.watch.advice import code_change, no_change_reason, rewrite
from gpufeed.watch.record import LoaderRecord


def _loader(source: str | None) -> LoaderRecord:
    return LoaderRecord(0, "DataLoader", "train.py:12", source, "CIFAR10", None, 256, 4, True, False, 2,
                        "RandomSampler", False)  # fmt: skip


def _added(diff: str) -> str:
    return next(line[2:] for line in diff.splitlines() if line.startswith("+ "))


def test_a_one_line_call_becomes_a_two_line_diff_keeping_batch_size_and_shuffle():
    diff = code_change(_loader("DataLoader(train_ds, batch_size=256, shuffle=True, num_workers=4, pin_memory=True)"))
    assert diff == (
        "- DataLoader(train_ds, batch_size=256, shuffle=True, num_workers=4, pin_memory=True)\n"
        "+ gf.accelerate(train_ds, batch_size=256, shuffle=True)"
    )


def test_a_multi_line_call_is_removed_line_by_line_and_its_arguments_kept_as_written():
    source = textwrap.dedent(
        """\
        torch.utils.data.DataLoader(
                datasets.ImageFolder(args.data, transform=train_tf),
                batch_size=args.batch_size,
                shuffle=True,
                drop_last=True,
                num_workers=args.workers,
                persistent_workers=True,
                prefetch_factor=4,
                worker_init_fn=seed_worker,
            )"""
    )
    diff = code_change(_loader(source))
    removed = [line for line in diff.splitlines() if line.startswith("- ")]
    assert len(removed) == 10 and removed[0] == "- torch.utils.data.DataLoader("
    assert _added(diff) == (
        "gf.accelerate(datasets.ImageFolder(args.data, transform=train_tf), batch_size=args.batch_size, "
        "shuffle=True, drop_last=True)"
    )


def test_a_keyword_dataset_and_positional_batch_size_and_shuffle_are_read_by_position():
    assert _added(code_change(_loader("DataLoader(dataset=ds, batch_size=64)"))) == (
        "gf.accelerate(ds, batch_size=64, shuffle=False)"
    )
    assert _added(code_change(_loader("DataLoader(ds, 128, True, num_workers=2)"))) == (
        "gf.accelerate(ds, batch_size=128, shuffle=True)"
    )


def test_dataloader_defaults_that_differ_from_accelerate_are_written_out():
    # DataLoader's defaults: batch_size=1, shuffle=False; accelerate's: 256, True. The batches must stay the same.
    assert _added(code_change(_loader("DataLoader(ds)"))) == "gf.accelerate(ds, batch_size=1, shuffle=False)"
    assert _added(code_change(_loader("DataLoader(ds, batch_size=8, shuffle=None)"))) == (
        "gf.accelerate(ds, batch_size=8, shuffle=False)"
    )


def test_a_variable_batch_size_and_an_expression_are_kept_as_their_source_text():
    source = "DataLoader(train_set, batch_size=cfg['bs'] * world, shuffle=not args.no_shuffle, num_workers=n)"
    assert _added(code_change(_loader(source))) == (
        "gf.accelerate(train_set, batch_size=cfg['bs'] * world, shuffle=not args.no_shuffle)"
    )


def test_the_suggested_call_parses():
    diff = code_change(_loader("DataLoader(\n    ds,\n    batch_size=32,  # per GPU\n    shuffle=True,\n)"))
    ast.parse(_added(diff))  # a comment inside the call must not swallow the rest of the line
    assert _added(diff) == "gf.accelerate(ds, batch_size=32, shuffle=True)"


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("DataLoader(ds, batch_size=32, sampler=DistributedSampler(ds))", "sampler="),
        ("DataLoader(ds, batch_sampler=BucketSampler(ds, 32))", "batch_sampler="),
        ("DataLoader(ds, batch_size=32, collate_fn=pad_collate)", "collate_fn="),
        ("DataLoader(ds, 32, False, RandomSampler(ds))", "sampler="),
        ("DataLoader(ds, **loader_kwargs)", "**kwargs"),
        ("DataLoader(*args)", "*args"),
        (None, "not readable"),
        ("DataLoader(ds, batch_size=", "could be parsed"),
    ],
)
def test_what_accelerate_cannot_take_as_is_gives_no_change_and_says_why(source, why):
    loader = _loader(source)
    assert code_change(loader) is None
    assert why in no_change_reason(loader)


def test_a_sampler_of_none_is_not_a_sampler():
    loader = _loader("DataLoader(ds, batch_size=32, sampler=None, collate_fn=None)")
    assert _added(code_change(loader)) == "gf.accelerate(ds, batch_size=32, shuffle=False)"
    assert no_change_reason(loader) is None


def test_an_argument_spanning_lines_with_a_comment_inside_is_rewritten_to_valid_code():
    source = "DataLoader(\n    Subset(ds,  # the training part\n           idx),\n    batch_size=16,\n)"
    added = _added(code_change(_loader(source)))
    ast.parse(added)
    assert added == "gf.accelerate(Subset(ds, idx), batch_size=16, shuffle=False)"


def test_the_removed_lines_read_as_the_call_did_inside_an_indented_block():
    # the hook's source text starts at the call; its continuation lines keep the file's indentation
    source = "DataLoader(\n            train_ds,\n            batch_size=32,\n        )"
    assert code_change(_loader(source)).splitlines() == [
        "- DataLoader(",
        "-     train_ds,",
        "-     batch_size=32,",
        "- )",
        "+ gf.accelerate(train_ds, batch_size=32, shuffle=False)",
    ]


@pytest.mark.parametrize(
    "source, inside",
    [
        ("accelerator.prepare(model, optimizer, train_dataloader)", "accelerator.prepare"),
        ("trainer.fit(model, datamodule=dm)", "trainer.fit"),
        ("fabric.setup_dataloaders(train_loader)", "fabric.setup_dataloaders"),
    ],
)
def test_a_loader_built_inside_a_library_call_gets_no_rewrite_of_that_call(source, inside):
    # Accelerate and Lightning build the loader the script iterates from one the script made: rewriting their call
    # as gf.accelerate(model, batch_size=optimizer, ...) would be nonsense
    from gpufeed.watch.advice import _rewrite

    change, reason = _rewrite(source)
    assert change is None and f"built inside `{inside}(...)`" in reason and "replace that DataLoader(...)" in reason


def test_a_stateful_dataloader_takes_dataloaders_arguments_and_a_subclass_with_its_own_init_does_not():
    stateful = LoaderRecord(0, "StatefulDataLoader", "train.py:12", "StatefulDataLoader(ds, 64, True, num_workers=8)",
                            "CIFAR10", None, 64, 8, False, False, 2, "RandomSampler", False,
                            init_of="torchdata.stateful_dataloader.stateful_dataloader.StatefulDataLoader")  # fmt: skip
    assert code_change(stateful) == (
        "- StatefulDataLoader(ds, 64, True, num_workers=8)\n+ gf.accelerate(ds, batch_size=64, shuffle=True)"
    )
    own = LoaderRecord(0, "MyLoader", "train.py:12", "MyLoader(ds, 64, augment=True)", "CIFAR10", None, 64, 0, False,
                       False, None, "RandomSampler", False, init_of="train.MyLoader")  # fmt: skip
    assert code_change(own) is None
    assert "a train.MyLoader, a subclass of torch's DataLoader with its own __init__" in no_change_reason(own)
    # a library's subclass called DataLoader too (torch_geometric's: its own arguments and collate)
    graphs = LoaderRecord(0, "DataLoader", "train.py:12", "DataLoader(graphs, batch_size=32, shuffle=True)", "QM9",
                          None, 32, 0, False, False, None, "RandomSampler", False,
                          init_of="torch_geometric.loader.dataloader.DataLoader")  # fmt: skip
    assert code_change(graphs) is None
    assert "replace DataLoader(...) with gf.accelerate" in no_change_reason(graphs)
    plain_subclass = LoaderRecord(0, "MyLoader", "train.py:12", "MyLoader(ds, batch_size=64)", "CIFAR10", None, 64,
                                  0, False, False, None, "SequentialSampler", False)  # fmt: skip
    assert code_change(plain_subclass) == (  # DataLoader's __init__: DataLoader's arguments
        "- MyLoader(ds, batch_size=64)\n+ gf.accelerate(ds, batch_size=64, shuffle=False)"
    )


def _ran(source: str, **facts) -> LoaderRecord:
    """A loader record with what the run passed (the hook records it): by default torch's own batching and
    collate, a RandomSampler."""
    facts = {"shuffle": True, "batch_sampler": None, "collate_fn": None, **facts}
    sampler = facts.pop("sampler", "RandomSampler")
    return LoaderRecord(0, "DataLoader", "train.py:12", source, "ImageFolder", None, 256, 4, True, False, 2, sampler,
                        False, **facts)  # fmt: skip


def test_a_sampler_that_was_none_in_the_run_is_no_obstacle_and_the_runs_order_is_written():
    # the ImageNet example: sampler=train_sampler, None unless distributed; shuffle=(train_sampler is None)
    source = (
        "DataLoader(train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None), "
        "num_workers=args.workers, pin_memory=True, sampler=train_sampler)"
    )
    assert _added(code_change(_ran(source))) == "gf.accelerate(train_dataset, batch_size=args.batch_size, shuffle=True)"
    # under torchrun the same line had a DistributedSampler: accelerate shares the data out itself
    change, reason = rewrite(_ran(source, sampler="DistributedSampler", shuffle=True))
    assert reason is None and change.new.endswith("shuffle=True)")
    assert any("DistributedSampler is not needed" in n for n in change.notes)
    # an order of the script's own (a WeightedRandomSampler) is named
    weighted = _ran(source, sampler="WeightedRandomSampler", shuffle=None)
    assert code_change(weighted) is None and "a WeightedRandomSampler in this run" in no_change_reason(weighted)


def test_a_batch_sampler_or_collate_fn_that_was_torchs_own_in_the_run_is_dropped_and_a_custom_one_named():
    auto = _ran("DataLoader(ds, batch_sampler=make_batches(ds), collate_fn=collate)", shuffle=False)
    assert _added(code_change(auto)) == "gf.accelerate(ds, batch_size=256, shuffle=False)"
    custom = _ran("DataLoader(ds, batch_size=8, collate_fn=collate)", collate_fn="train.pad_collate")
    assert code_change(custom) is None and "collate_fn= is train.pad_collate" in no_change_reason(custom)


def test_timms_create_loader_is_rewritten_with_its_recipe_given_to_create_transform():
    source = textwrap.dedent(
        """\
        create_loader(
                dataset_train,
                input_size=data_config['input_size'],
                batch_size=args.batch_size,
                is_training=True,
                scale=args.scale,
                hflip=args.hflip,
                interpolation=train_interpolation,
                mean=data_config['mean'],
                num_workers=args.workers,
                use_prefetcher=args.prefetcher,
            )"""
    )
    rec = _ran(source, built_by="timm.data.loader.create_loader", collate_fn="timm.data.loader.fast_collate")
    change, reason = rewrite(rec)
    assert reason is None and change.imports == ["import gpufeed as gf", "import timm.data"]
    assert change.new == (
        "gf.accelerate(dataset_train, batch_size=args.batch_size, shuffle=True, drop_last=True, "
        "transform=timm.data.create_transform(data_config['input_size'], is_training=True, scale=args.scale, "
        "hflip=args.hflip, interpolation=train_interpolation, mean=data_config['mean']))"
    )
    mixing = _ran(source, built_by="timm.data.loader.create_loader", collate_fn="timm.data.mixup.FastCollateMixup")
    assert code_change(mixing) is None and "mix=gpufeed.augment.MixUp" in no_change_reason(mixing)


def test_a_hugging_face_trainers_loader_gets_the_reason_gpufeed_cannot_serve_it_as_is():
    rec = _ran("trainer.train()", built_by="transformers.trainer.Trainer.train")
    assert code_change(rec) is None
    assert "a Hugging Face Trainer built the DataLoader inside `trainer.train(...)`" in no_change_reason(rec)
