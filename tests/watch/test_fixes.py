"""gpufeed.watch.fixes: the findings and the last line of a report."""

from __future__ import annotations

from gpufeed.watch.analyse import WatchReport
from gpufeed.watch.fixes import worth

_PREDICTED = {"fix": "accelerate", "speedup": 1.42, "new_step_s": 0.0195, "step_s": 0.0277, "one_time_s": 0.9,
              "payback_steps": 113, "payback_epochs": None}  # fmt: skip


def test_the_worth_line_names_the_code_change_only_when_the_report_has_one():
    r = WatchReport("data-bound", 0.4, "finished", ["python", "t.py"], 1, "cpu", prediction=_PREDICTED)
    r.no_change_reason = "a Hugging Face Trainer built the DataLoader inside `trainer.train(...)`"
    assert worth(r).startswith("gf.accelerate (no code change suggested: see above): predicted 1.42x the loop's")
    r.code_change, r.no_change_reason = "- DataLoader(ds)\n+ gf.accelerate(ds)", None
    assert worth(r).startswith("the code change to gf.accelerate: predicted 1.42x the loop's speed")
