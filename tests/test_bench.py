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
    assert base.speedup == 1.0 and ours.speedup == base.epoch_s / ours.epoch_s
    assert ours.floor == FP32 and ours.floor_ratio == ours.epoch_s / floor.epoch_s
    assert graphs.skipped == "needs a CUDA device" and graphs.epoch_s is None
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert {"name", "epoch_s", "images_per_s", "speedup"} <= set(saved["rows"][0])
    assert saved["environment"]["sizing"].startswith("CPU run: small model on a 512-image subset")
    assert (tmp_path / "bench.png").stat().st_size > 10_000
    assert any("skipped" in line for line in lines)
