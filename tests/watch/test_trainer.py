"""gpufeed.watch.trainer: a Hugging Face Trainer's training batches from gf.accelerate, one line before
``trainer.train()``; what stops it is the reason."""

from __future__ import annotations

import ast
import subprocess
import textwrap
from typing import Any

import pytest

from gpufeed.watch.advice import code_change, no_change_reason, rewrite
from gpufeed.watch.diff import file_change
from gpufeed.watch.record import LoaderRecord

_HF = {
    "function": "train_transforms", "recipe": "_train_transforms", "recipe_text": "Compose(...)", "image": "image",
    "label": "label", "collate": None,
    "batch": {"kind": "dict", "keys": ["pixel_values", "labels"], "images": "pixel_values", "labels": "labels"},
}  # fmt: skip
_CALL = "trainer.train(resume_from_checkpoint=checkpoint)"


def _record(source: str = _CALL, **kw: Any) -> LoaderRecord:
    facts = {"shuffle": True, "sampler": "RandomSampler", "hf": _HF, **kw}
    return LoaderRecord(1, "DataLoader", "run.py:12", source, "Dataset", None, 8, 0, False, False, None,
                        facts.pop("sampler"), False, built_by="transformers.trainer.Trainer.train",
                        batch_sampler="BatchSampler", collate_fn="__main__.collate_fn", **facts)  # fmt: skip


def test_the_change_is_a_line_before_train_that_gives_the_trainer_gf_accelerates_batches(tmp_path):
    # the shape of transformers' run_image_classification.py: train() inside `if training_args.do_train:`
    text = textwrap.dedent(
        """\
        import torch


        def main(trainer, training_args, checkpoint, _train_transforms):
            if training_args.do_train:
                train_result = trainer.train(resume_from_checkpoint=checkpoint)
                trainer.save_model()
        """
    )
    (tmp_path / "run.py").write_text(text)
    change, why = rewrite(_record())
    assert why is None and change is not None
    assert code_change(_record()) == (
        "+ trainer.get_train_dataloader = lambda: gf.accelerate(trainer.train_dataset, "
        "batch_size=trainer.args.train_batch_size, shuffle=True, drop_last=trainer.args.dataloader_drop_last, "
        "seed=trainer.args.seed, transform=_train_transforms, batch_keys=('pixel_values', 'labels'))\n"
        "  trainer.train(resume_from_checkpoint=checkpoint)"
    )
    new, diff = file_change(text, 6, change, "run.py")
    lines = new.splitlines()
    at = lines.index("        train_result = trainer.train(resume_from_checkpoint=checkpoint)")
    assert lines[at - 1] == f"        {change.before}" and lines[0] == "import gpufeed as gf"
    ast.parse(new)
    (tmp_path / "fix.diff").write_text(diff)
    done = subprocess.run(["patch", "-p1", "-i", "fix.diff"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "run.py").read_text() == new


@pytest.mark.parametrize(
    ("facts", "said"),
    [
        ({"shuffle": None, "sampler": "LengthGroupedSampler"}, "ordered the samples with a LengthGroupedSampler"),
        ({"hf": {**_HF, "collate": "collate_fn pads the token ids"}}, "collate_fn pads the token ids"),
        ({"hf": {**_HF, "recipe": None, "why": "it applies a tokenizer"}}, "it applies a tokenizer"),
    ],
)
def test_what_the_trainers_batches_need_beyond_gf_accelerate_is_the_reason(facts, said):
    rec = _record(**facts)
    assert code_change(rec) is None and said in no_change_reason(rec)


@pytest.mark.parametrize(
    "source",
    ["Trainer(model=model, args=args, train_dataset=ds).train()", "make_trainer(cfg).train()", "trainers[0].train()"],
)
def test_a_trainer_not_held_by_a_name_gets_the_reason_not_a_line_that_builds_another_trainer(source):
    # `Trainer(...).train()`: a line before it naming `Trainer(...)` would build (and change) a second Trainer, and
    # the one that trains would keep its DataLoader (seen: a verified "gain" of a run that read the same loader)
    rec = _record(source)
    assert code_change(rec) is None
    assert no_change_reason(rec) == (
        f"the Trainer that trains is {source.rsplit('.train(', 1)[0]}, not held by a name: assign it first "
        "(trainer = ...; trainer.train()) so that a line before trainer.train() can give it gf.accelerate's batches"
    )
