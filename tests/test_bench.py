import json

from gpufeed.bench import FP32, ladder, run_bench


def test_ladder_order_and_floors():
    rungs = ladder(16)
    assert rungs[0].name == "torchvision DataLoader, num_workers=0" and rungs[1].num_workers == 16
    names = {r.name for r in rungs}
    assert all(r.floor in names for r in rungs if r.floor)


def test_bench_rows_json_and_plot_on_a_tiny_cpu_run(tmp_path):
    only = ["torchvision DataLoader, num_workers=0", "gpufeed", "gpufeed + bf16 + channels_last + CUDA graphs", FP32]
    lines = []
    rows = run_bench("cpu", train_size=512, test_size=128, batch_size=128, out=tmp_path, log=lines.append, only=only)
    assert [r.name for r in rows] == only
    base, ours, graphs, floor = rows  # ladder order
    for row in (base, ours, floor):  # 512 images a second epoch: 4 full batches of 128, timed
        assert round(row.images_per_s * row.epoch_s) == 512 and row.epoch_s > 0
    assert ours.floor == FP32 and graphs.skipped == "needs a CUDA device" and graphs.epoch_s is None
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert {"name", "epoch_s", "images_per_s", "speedup"} <= set(saved["rows"][0])
    assert saved["environment"]["sizing"].startswith("CPU run: small model on a 512-image subset")
    assert (tmp_path / "bench.png").stat().st_size > 10_000
    assert any("skipped" in line for line in lines)


def test_speedups_and_floor_ratios_relate_each_rung_to_the_first_and_to_its_floor():
    from gpufeed.bench import Row, _relate

    rows = [Row("loader", 8.0), Row("fast", 2.0, floor="floor"), Row("skipped"), Row("floor", 1.6)]
    _relate(rows)
    assert [r.speedup for r in rows] == [1.0, 4.0, None, 5.0]
    assert rows[1].floor_ratio == 1.25 and rows[0].floor_ratio is None and rows[2].speedup is None


def test_the_summary_compares_gpufeed_with_the_best_dataloader_rung_not_only_num_workers_0():
    import torch

    from gpufeed.bench import BASELINE, Row, summary

    tuned = "torchvision DataLoader, num_workers=4, persistent"
    rows = [Row(BASELINE, 8.0, data_wait_fraction=0.8), Row(tuned, 2.0), Row("gpufeed", 1.0), Row(FP32, 0.8)]
    text = summary(rows, torch.device("cpu"))
    assert f"(2.0x the best DataLoader rung ({tuned}), 8.0x num_workers=0)" in text


def test_a_batch_size_larger_than_the_training_images_is_refused_before_any_rung(tmp_path):
    import pytest

    from gpufeed import ConfigError

    from fakes import image_folder

    folder = image_folder(tmp_path / "photos", [(20, 20)] * 10)
    with pytest.raises(ConfigError, match=r"batch_size=64 is more than the 10 training images.*batch_size <= 10"):
        run_bench("cpu", batch_size=64, datasets=(folder, None), data=str(tmp_path / "photos"), image_size=32)


def test_the_verdict_counts_the_epoch_against_the_model_alone_not_only_the_wait():
    import torch

    from gpufeed.bench import BASELINE, Row, summary

    # workers that take the model's cores: the epoch is 2.9x the model alone though it waits 15%
    contended = [Row(BASELINE, 2.9, data_wait_fraction=0.15), Row("gpufeed", 1.1), Row(FP32, 1.0)]
    text = summary(contended, torch.device("cpu"))
    assert text.startswith("On this CPU, the plain DataLoader epoch is data-bound: it waits for data 15% of its 2.90 s")
    assert "yet its epoch takes 2.9x the model alone" in text and "the model, not the data" not in text
    waiting = [Row(BASELINE, 4.0, data_wait_fraction=0.6), Row("gpufeed", 1.1), Row(FP32, 1.0)]
    assert "data-bound: it waits for data 60% of its 4.00 s" in summary(waiting, torch.device("cpu"))
    modelled = [Row(BASELINE, 1.1, data_wait_fraction=0.05), Row("gpufeed", 1.05), Row(FP32, 1.0)]
    assert summary(modelled, torch.device("cpu")).endswith(": the model, not the data, is the cost here.")
