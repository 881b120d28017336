"""The change for a Hugging Face ``Trainer``: its training batches from ``gf.accelerate``.

A ``Trainer`` builds its training loader inside ``trainer.train()``: ``Trainer.get_train_dataloader`` makes a
``DataLoader`` of ``train_dataset`` with the ``data_collator`` and hands it to Accelerate's ``prepare``. That method
is the Trainer's documented place to change the batches ("Subclass and override this method if you want to inject
some custom behavior"), so the change is one line before ``trainer.train()``, in the script's own scope::

    trainer.get_train_dataloader = lambda: gf.accelerate(trainer.train_dataset, batch_size=trainer.args.
        train_batch_size, shuffle=True, drop_last=trainer.args.dataloader_drop_last, seed=trainer.args.seed,
        transform=_train_transforms, batch_keys=('pixel_values', 'labels'))

The batches stay the dicts the model takes (``batch_keys=``, as the collate function stacked them); the recipe the
dataset's ``set_transform`` function applies runs batched (:mod:`gpufeed.watch.hf` found it and its name there).
What stops it is said as for a ``DataLoader`` over the same dataset: a collate function that does more than stack
the fields, no single image column, a recipe not found; and a sampler of the Trainer's own other than its random
one (``group_by_length``'s ``LengthGroupedSampler``).

Example:
    >>> import ast
    >>> from gpufeed.watch.record import LoaderRecord
    >>> hf = {"function": "train_transforms", "recipe": "_train_transforms", "image": "image", "label": "label",
    ...       "collate": None, "batch": {"kind": "dict", "keys": ["pixel_values", "labels"],
    ...       "images": "pixel_values", "labels": "labels"}}
    >>> rec = LoaderRecord(0, "DataLoader", "run.py:80", "trainer.train()", "Dataset", None, 8, 0, False, False,
    ...                    None, "RandomSampler", False, shuffle=True, built_by="transformers.trainer.Trainer.train",
    ...                    hf=hf)
    >>> change, why = trainer_change("trainer.train()", ast.parse("trainer.train()", mode="eval").body, rec)
    >>> print(change.before)  # doctest: +NORMALIZE_WHITESPACE
    trainer.get_train_dataloader = lambda: gf.accelerate(trainer.train_dataset,
    batch_size=trainer.args.train_batch_size, shuffle=True, drop_last=trainer.args.dataloader_drop_last,
    seed=trainer.args.seed, transform=_train_transforms, batch_keys=('pixel_values', 'labels'))
"""

from __future__ import annotations

import ast

from .advice import Change, _hugging_face, _text
from .record import LoaderRecord

__all__ = ["trainer_change"]


def trainer_change(source: str, call: ast.Call, loader: LoaderRecord) -> tuple[Change | None, str | None]:
    """``(change, None)`` for ``<trainer>.train(...)`` that built ``loader`` over a Hugging Face dataset; ``(None,
    why)`` when its batches cannot come from gf.accelerate as they are; ``(None, None)`` for any other call or
    dataset (advice's general reason for a Trainer then applies)."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr != "train":
        return None, None
    trainer = _text(source, func.value)
    if loader.hf is None:  # a torch dataset, whose dicts the data_collator makes: advice's reason for a Trainer
        return None, None
    if loader.shuffle is not True:
        return None, (
            f"the Trainer ordered the samples with a {loader.sampler} here (group_by_length, or a sampler of its "
            "own): gf.accelerate draws a random order (shuffle=True, seed=)"
        )
    args = {"dataset": f"{trainer}.train_dataset"}
    notes: list[str] = []
    extra: list[str] = []
    blocking = _hugging_face(args, loader, notes, extra)
    if blocking:
        return None, "; ".join(blocking)
    settings = [
        args["dataset"],
        f"batch_size={trainer}.args.train_batch_size",
        "shuffle=True",
        f"drop_last={trainer}.args.dataloader_drop_last",
        f"seed={trainer}.args.seed",
        *extra,
    ]
    notes.append(
        f"{trainer}.train() asks get_train_dataloader() for its training batches (the Trainer's place to change "
        "them): the line before it gives it gf.accelerate's; under torch.distributed gf.accelerate gives each rank "
        "its share itself"
    )
    before = f"{trainer}.get_train_dataloader = lambda: gf.accelerate({', '.join(settings)})"
    return Change(source, source, notes=notes, before=before), None
