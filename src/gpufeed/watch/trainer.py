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
one (``group_by_length``'s ``LengthGroupedSampler``); a Trainer that no name holds
(``Trainer(...).train()``: a line naming it would build a second one, and the one that trains would keep its loader).

:mod:`gpufeed.watch.advice` applies its Hugging Face rules to ``<trainer>.train_dataset`` (the recipe, the
columns, ``batch_keys=``) and puts the line together with :func:`trainer_line`.

Example:
    >>> import ast
    >>> from gpufeed.watch.record import LoaderRecord
    >>> rec = LoaderRecord(0, "DataLoader", "run.py:80", "trainer.train()", "Dataset", None, 8, 0, False, False,
    ...                    None, "RandomSampler", False, shuffle=True, built_by="transformers.trainer.Trainer.train",
    ...                    hf={})
    >>> trainer_of(ast.parse("trainer.train()", mode="eval").body, rec)
    ('trainer', None)
    >>> print(trainer_line("trainer", ["transform=tf"])[0])  # doctest: +NORMALIZE_WHITESPACE
    trainer.get_train_dataloader = lambda: gf.accelerate(trainer.train_dataset,
    batch_size=trainer.args.train_batch_size, shuffle=True, drop_last=trainer.args.dataloader_drop_last,
    seed=trainer.args.seed, transform=tf)
"""

from __future__ import annotations

import ast

from .record import LoaderRecord

__all__ = ["trainer_line", "trainer_of"]


def trainer_of(call: ast.Call, loader: LoaderRecord) -> tuple[str | None, str | None]:
    """``(the Trainer's expression, None)`` for ``<trainer>.train(...)`` that built ``loader`` over a Hugging Face
    dataset in a random order; ``(None, why)`` when the Trainer ordered its samples itself; ``(None, None)`` for any
    other call or dataset (advice's general reason for a Trainer then applies)."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr != "train" or loader.hf is None:
        return None, None  # a torch dataset, whose dicts the data_collator makes: advice's reason for a Trainer
    if not _held(func.value):  # Trainer(...).train(): a line naming it would build a second Trainer
        return None, (
            f"the Trainer that trains is {ast.unparse(func.value)}, not held by a name: assign it first (trainer = "
            "...; trainer.train()) so that a line before trainer.train() can give it gf.accelerate's batches"
        )
    if loader.shuffle is not True:
        return None, (
            f"the Trainer ordered the samples with a {loader.sampler} here (group_by_length, or a sampler of its "
            "own): gf.accelerate draws a random order (shuffle=True, seed=)"
        )
    return ast.unparse(func.value), None


def _held(node: ast.expr) -> bool:
    """Whether ``node`` names an object without building one: ``trainer``, ``self.trainer`` (no call, no item)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def trainer_line(trainer: str, extra: list[str]) -> tuple[str, str]:
    """``(the statement put before <trainer>.train(), its note)``; ``extra``: gf.accelerate's arguments for the
    dataset (``transform=``, ``batch_keys=``...)."""
    settings = [
        f"{trainer}.train_dataset",
        f"batch_size={trainer}.args.train_batch_size",
        "shuffle=True",
        f"drop_last={trainer}.args.dataloader_drop_last",
        f"seed={trainer}.args.seed",
        *extra,
    ]
    note = (
        f"{trainer}.train() asks get_train_dataloader() for its training batches (the Trainer's place to change "
        "them): the line before it gives it gf.accelerate's; under torch.distributed gf.accelerate gives each rank "
        "its share itself"
    )
    return f"{trainer}.get_train_dataloader = lambda: gf.accelerate({', '.join(settings)})", note
