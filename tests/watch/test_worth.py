"""The report's advice never contradicts itself (gpufeed.watch.worth, NOTE [ one verdict ]): each contradiction the
fourth round of trials quoted, on constructed records, and a grid of findings over which no report holds two claims
that cannot both be true. Constructed measurements only: report() and its text are pure given the records."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufeed.watch.analyse import report
from gpufeed.watch.record import LoaderRecord, ProcessRecord
from gpufeed.watch.spread import order
from gpufeed.watch.verify import summarise

SOURCE = "DataLoader(train_ds, batch_size=32, shuffle=True, num_workers={workers})"
CUSTOM = "DataLoader(train_ds, batch_size=32, collate_fn=pad_batch, num_workers={workers})"  # no rewrite
SCRIPT = {"img_s": 1500.0, "settings": {"batch_size": 32, "num_workers": 2}}
ACCELERATED = {"samples": 384, "batch_size": 32, "device": "cpu", "notes": [], "seconds": 3.0,
               "accelerate": {"plan": "storage:  in memory", "img_s": 9000.0, "build_s": 0.4},
               "script_loader": SCRIPT}  # fmt: skip
REFUSED = {"samples": 384, "batch_size": 32, "device": "cpu", "notes": [], "seconds": 9.0, "script_loader": SCRIPT,
           "refused": {"error": "UnsupportedTransformError", "reason": "Lambda() is opaque"}}  # fmt: skip


def _tuned(img_s, by_workers):
    best = max(by_workers, key=by_workers.get)
    return {"kwargs": {"num_workers": int(best), "pin_memory": False}, "img_s": img_s, "speedup": 1.0,
            "budget_s": 15, "by_workers": by_workers}  # fmt: skip


def _records(wait, step, *, workers=2, source=SOURCE, collate="?", cores=2, device="cpu", cpu=None, side=None,
             machine=()):  # fmt: skip
    """One process whose main loader's 30 batches each waited ``wait`` then stepped ``step`` (the first waits 2 s:
    the start-up), with CPU samples ``(main %, workers %)`` over the steps."""
    n, t, requested = 30, 1.0, []
    waits = [2.0] + [wait] * (n - 1)
    for w in waits:
        requested.append(t)
        t += w + step
    ld = LoaderRecord(
        0, "DataLoader", "train.py:20", source.format(workers=workers), "CIFAR10", "Compose(ToTensor())", 32, workers,
        False, False, 2 if workers else None, "RandomSampler", False, epochs=1, requested=requested, waits=waits,
        samples=[32] * n, shuffle=True, batch_sampler=None, collate_fn=collate,
    )  # fmt: skip
    samples = [(3.5 + 0.2 * i, *cpu) for i in range(5)] if cpu else []
    return [ProcessRecord(0, 1, 1000, ["train.py"], device, 0.0, 60.0, "stopped", [ld], samples, cores, [], side,
                          machine=list(machine))]  # fmt: skip


def _verified(original, changed, predicted):
    """A verification of A B B A (or one pair) whose runs measured these times per step."""
    it = {"original": iter(original), "changed": iter(changed)}
    runs = []
    for number, side in enumerate(order(2 * len(original)), 1):
        step = next(it[side])
        runs.append({"run": number, "side": side, "status": 0, "seconds": 5.0, "exit": "stopped", "step_s": step,
                     "rest_s": step / 2, "wait_fraction": 0.5, "img_s": 32 / step, "first_batch_s": 2.0,
                     "batches": 30, "loader": "DataLoader at train.py:20", "machine": None,
                     "fixed": side == "changed"})  # fmt: skip
    v = summarise(runs, None, predicted)
    v.update(command=["train.py"], planned=len(runs), budget_s=600.0, stopped=None, interrupted=None)
    return v


def _worth(r):
    return next(line for line in str(r).splitlines() if line.startswith("worth doing: "))


def test_two_workers_competing_for_two_cores_are_predicted_not_called_the_steps_own_cost():
    # the loop waits 14%: compute-bound; its 2 workers used 0.9 of the 2 cores the step (1.1) could use
    r = report(_records(0.005, 0.030, cpu=(110.0, 90.0), side=ACCELERATED))
    assert r.verdict == "compute-bound"
    p = r.prediction
    assert p["free_step_s"] == pytest.approx(0.030 * 0.55 + 32 / 9000)  # the rest shrunk to 1.1 / 2 of it
    assert p["free_speedup"] == pytest.approx(0.035 / (0.030 * 0.55 + 32 / 9000))
    r.verify = _verified([0.0350, 0.0352], [0.0214, 0.0216], p)  # the verified 1.63x
    worth = _worth(r)
    assert "the step itself is the cost" not in str(r)
    assert worth.startswith(
        "worth doing: the loader's 2 workers compete with the step for the 2 cores (they used 0.9 and the main "
        "process 1.1 while the steps ran): the code change to gf.accelerate, which has no workers, predicted "
        f"{p['speedup']:.2f}x to {p['free_speedup']:.2f}x (the workers' cores given back to the step)"
    )
    assert "verified on this script: 1.63x (1.63x to 1.64x over 2 pairs" in worth
    assert "up to 1.75x (20.06 ms a step) with the cores the script's workers used" in str(r)
    assert "code change at train.py:20 (with `import gpufeed as gf`):" in str(r)  # the change the advice names
    [saturated] = [f for f in r.diagnosis.findings if f.kind == "cpu-saturated"]
    assert saturated.expected_gain.startswith("up to 1.75x with gf.accelerate, predicted from the CPU shares")
    assert not str(r).splitlines()[-1].startswith("  check it")  # verified: no suggestion to verify


def test_competing_workers_without_a_side_measurement_are_named_with_the_rest_predicted_from_the_cpu_shares():
    r = report(_records(0.005, 0.030, workers=3, cores=2, cpu=(120.0, 80.0)))
    assert r.prediction is None and "the step itself is the cost" not in str(r)
    assert "without them the rest of the step may take down to 60% of its 30.0 ms" in _worth(r)
    assert str(r).splitlines()[-1].startswith("  check it on this script: gpufeed diagnose --verify")


def test_on_a_large_gpu_machine_workers_do_not_compete_but_a_verified_gain_beyond_the_bound_is_never_denied():
    records = _records(0.005, 0.030, cores=16, device="cuda:0", cpu=(100.0, 200.0), side=ACCELERATED)
    r = report(records)
    assert r.prediction["free_speedup"] is None
    assert "the step itself is the cost" in _worth(r)  # nothing measured says otherwise
    r.verify = _verified([0.0350, 0.0352], [0.0214, 0.0216], r.prediction)
    worth = _worth(r)
    assert "the step itself is the cost" not in worth
    assert worth.startswith(
        "worth doing: the data side alone is worth at most 1.17x to this loop (it waits 14% of the time), yet the "
        "change measured at least 1.63x on this script"
    )


def test_more_workers_are_not_said_no_better_when_only_the_scripts_own_count_was_measured():
    side = {**ACCELERATED, "tuned": _tuned(1500.0, {"0": 1500.0})}
    r = report(_records(0.03, 0.01, workers=0, cpu=(100.0, 0.0), side=side))
    [workers] = [f for f in r.diagnosis.findings if f.kind == "too-few-workers"]
    assert "no better" not in str(r)
    assert workers.expected_gain.startswith("not measured: the side measurement measured num_workers=0 only")
    assert "tune_dataloader(dataset, batch_size, time_budget_s=60)" in workers.fix


def test_more_workers_measured_no_better_names_the_counts_measured():
    side = {**ACCELERATED, "tuned": _tuned(1510.0, {"0": 1510.0, "1": 1490.0, "2": 1470.0})}
    r = report(_records(0.03, 0.01, workers=0, cpu=(100.0, 0.0), side=side))
    [workers] = [f for f in r.diagnosis.findings if f.kind == "too-few-workers"]
    assert workers.fix.startswith("more workers measured no better here (num_workers=0, 1 and 2 measured; ")


def test_tuned_settings_that_measured_no_better_are_not_called_the_fix():
    side = {**REFUSED, "tuned": _tuned(1520.0, {"0": 1400.0, "2": 1520.0})}  # within 5% of the script's 1500
    r = report(_records(0.03, 0.01, cpu=(100.0, 60.0), side=side))
    text = str(r)
    assert "no DataLoader setting measured better" in text and "are the fix" not in text
    assert r.no_change_reason == (
        "gf.accelerate refused this pipeline (UnsupportedTransformError): no DataLoader setting measured better "
        "either: make the transform one gf.accelerate can batch (gpufeed.augment's ops)"
    )
    better = report(_records(0.03, 0.01, cpu=(100.0, 60.0), side={**REFUSED, "tuned": _tuned(2400.0, {"2": 2400.0})}))
    assert better.no_change_reason.endswith(": the tuned DataLoader settings above are the fix")
    assert "no DataLoader setting measured better" not in str(better)


def test_the_code_change_is_not_worth_doing_where_none_was_written():
    # accelerate measured well, but the script's own collate function keeps the call from being rewritten
    r = report(_records(0.03, 0.01, source=CUSTOM, collate="pad_batch", side=ACCELERATED))
    assert r.code_change is None and r.prediction["fix"] == "accelerate"
    worth = _worth(r)
    assert "the code change" not in worth
    assert worth.startswith(
        "worth doing: serving the loop from gf.accelerate (no code change was written: collate_fn= is pad_batch, "
        "which shapes each batch in Python;"
    )
    assert "check it on this script" not in str(r)  # nothing to apply


def test_a_fix_not_worth_doing_is_not_suggested_for_verification():
    slow = {**ACCELERATED, "accelerate": {**ACCELERATED["accelerate"], "img_s": 1100.0}}  # slower than the script's
    r = report(_records(0.03, 0.01, workers=0, side=slow))
    assert _worth(r).startswith("worth doing: no fix measured here is worth doing")
    assert "check it on this script" not in str(r)


def test_a_change_predicted_small_but_verified_large_is_not_called_not_worth_doing():
    # a fresh trial: predicted 1.04x, verified 5.90x (3.85x to 8.82x over 2 pairs), and the worth line said "no fix
    # measured here is worth doing ...; verified on this script: 5.90x"
    slow = {**ACCELERATED, "accelerate": {**ACCELERATED["accelerate"], "img_s": 1100.0}}
    r = report(_records(0.03, 0.01, workers=0, side=slow))
    assert _worth(r).startswith("worth doing: no fix measured here is worth doing")
    r.verify = _verified([0.040, 0.041], [0.010, 0.011], r.prediction)
    assert _worth(r).startswith(
        f"worth doing: the code change to gf.accelerate: predicted {r.prediction['speedup']:.2f}x, yet measured at "
        "least 3.73x on this script (the verification above)"
    )
    assert re.search("^code change", str(r), re.M)


def test_a_change_predicted_large_but_verified_no_faster_is_not_called_worth_doing():
    r = report(_records(0.03, 0.01, workers=0, side=ACCELERATED))
    assert r.prediction["speedup"] > 1.5
    r.verify = _verified([0.040, 0.041], [0.040, 0.041], r.prediction)
    assert _worth(r).startswith(
        f"worth doing: nothing here: the code change to gf.accelerate predicted {r.prediction['speedup']:.2f}x, yet "
        "measured at most 1.00x on this script (the verification above)"
    )


def test_a_compute_bound_loop_whose_worth_line_names_the_change_shows_it():
    # a fresh trial: compute-bound (24% waiting), "the code change to gf.accelerate would still give about 1.29x",
    # and no code change, diff or patch command anywhere in the report
    r = report(_records(0.008, 0.03, workers=0, side=ACCELERATED))
    assert r.verdict == "compute-bound" and "the code change to gf.accelerate would still give" in _worth(r)
    assert re.search("^code change at train.py:20", str(r), re.M)


# Claims that cannot both be true, as regular expressions over the report's text: (a, b) never both.
CONTRADICTIONS = [
    ("the step itself is the cost", "compete with the step for the"),
    ("are the fix", "no DataLoader setting measured better"),
    ("^worth doing: the tuned DataLoader settings", "no DataLoader setting measured better"),
    (r"\bagrees with the prediction", "disagrees with the prediction"),
    ("the machine was quiet", "the machine was busy"),
    ("no code change suggested", "^code change"),
    ("no fix measured here is worth doing", "check it on this script"),
    ("not saturated by the script", "^- cpu-saturated"),
]


@settings(max_examples=150, deadline=None)
@given(
    shape=st.sampled_from([(0.03, 0.01), (0.008, 0.03), (0.005, 0.03), (0.0005, 0.05)]),
    workers=st.sampled_from([0, 1, 2, 3]),
    cores=st.sampled_from([2, 16]),
    device=st.sampled_from(["cpu", "cuda:0"]),
    cpu=st.sampled_from([None, (110.0, 90.0), (60.0, 20.0), (100.0, 0.0)]),
    side=st.sampled_from(["none", "error", "accelerated", "slow", "refused-better", "refused-same", "one-count"]),
    custom=st.booleans(),
    verified=st.sampled_from([None, "error", "big", "none", "wide", "one-pair"]),
)
def test_no_report_over_a_grid_of_findings_holds_two_contradictory_claims(
    shape, workers, cores, device, cpu, side, custom, verified
):
    sides = {
        "none": None,
        "error": {"error": "RuntimeError: boom"},
        "accelerated": ACCELERATED,
        "slow": {**ACCELERATED, "accelerate": {**ACCELERATED["accelerate"], "img_s": 1100.0}},
        "refused-better": {**REFUSED, "tuned": _tuned(2400.0, {"0": 1500.0, "2": 2400.0})},
        "refused-same": {**REFUSED, "tuned": _tuned(1520.0, {"0": 1500.0, "2": 1520.0})},
        "one-count": {**ACCELERATED, "tuned": _tuned(1500.0, {str(workers): 1500.0})},
    }
    source, collate = (CUSTOM, "pad_batch") if custom else (SOURCE, "?")
    r = report(_records(*shape, workers=workers, cores=cores, device=device, cpu=cpu, side=sides[side],
                        source=source, collate=collate))  # fmt: skip
    step = shape[0] + shape[1]
    runs = {"big": ([step, step * 1.01], [step / 1.63, step / 1.62]), "none": ([step, step], [step, step * 1.01]),
            "wide": ([step, step * 1.3], [step / 1.4, step]), "one-pair": ([step], [step / 1.2])}  # fmt: skip
    if verified == "error":
        r.verify = {"error": "the changed script wrote no record (exit status 1)"}
    elif verified is not None:
        r.verify = _verified(*runs[verified], r.prediction)
    text = str(r)
    for a, b in CONTRADICTIONS:
        assert not (re.search(a, text, re.M) and re.search(b, text, re.M)), (a, b, text)
    worth = _worth(r)
    if "the code change" in worth or "the code change below" in text:
        assert r.code_change is not None, worth
        assert re.search("^code change", text, re.M), text  # the change the advice names is shown
    if "more workers measured no better" in text:
        assert len((r.side or {}).get("tuned", {}).get("by_workers", {})) > 1, text
    if "the step itself is the cost" in text:  # nothing measured says the step shrinks without the loader's work
        spread = (r.verify or {}).get("spread")
        assert spread is None or spread["gain"]["low"] <= 1.1 / (1 - (r.data_wait_fraction or 0)), text
    gain = ((r.verify or {}).get("spread") or {}).get("gain")
    if gain is not None and "no fix measured here is worth doing" in worth:  # the verification decides, not the
        assert min(gain["low"], gain["median"]) < 1.05, worth  # prediction it measured
    p = r.prediction
    if p is not None and "predict" in worth:
        assert f"{p['speedup']:.2f}x" in worth  # the same figure as the prediction's block
