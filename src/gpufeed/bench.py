"""The speed ladder behind ``gpufeed bench``: each step of the data pipeline, end to end, on CIFAR-10 or an
image folder.

Every rung trains the same model with the same recipe for two epochs in this one process and
keeps the second (steady-state) epoch; the first epoch is recorded too, since worker start-up and
cuDNN tuning hide there. The "model alone" rungs feed one fixed batch already on the device: the
floor each pipeline is measured against, one per precision set-up.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from .device import environment, resolve_device
from .diagnose import CONTENTION_SLOWDOWN, DATA_BOUND_FRACTION
from .errors import ConfigError
from .report import bar_chart, format_table
from .train.loop import TrainConfig, train
from .workers import default_workers

__all__ = ["BASELINE", "STREAM", "STREAM_BASELINE", "Rung", "Row", "ladder", "run_bench", "summary"]


@dataclass(frozen=True)
class Rung:
    name: str
    loader: str
    amp: str = "off"
    channels_last: bool = False
    cuda_graphs: bool = False
    num_workers: int | None = None
    floor: str | None = None  # name of the model-alone rung of the same precision set-up
    gpu_only: bool = False
    arrays_only: bool = False  # keeps CIFAR's arrays as float tensors: not for images of different sizes


@dataclass
class Row:
    name: str
    epoch_s: float | None = None
    images_per_s: float | None = None
    speedup: float | None = None
    first_epoch_s: float | None = None
    data_wait_fraction: float | None = None
    gpu_util: float | None = None
    peak_memory_mib: float | None = None
    test_acc: float | None = None
    floor: str | None = None
    floor_ratio: float | None = None
    skipped: str | None = None


BASELINE = "torchvision DataLoader, num_workers=0"  # what every speed-up is quoted against
FP32, BF16, GRAPHED = "model alone, fp32", "model alone, bf16 + channels_last", "model alone, bf16 + CL + CUDA graph"
STREAM = "gpufeed.stream"


STREAM_BASELINE = "StreamingDataset in a DataLoader, num_workers=0"  # a stream's: what its users run without gpufeed


def ladder(workers: int, stream: bool = False) -> list[Rung]:
    """The rungs, in order; ``workers`` is the tuned DataLoader's worker count. Of a ``stream`` (an MDS dataset):
    the engine's ``StreamingDataset`` in a ``DataLoader`` (PIL decode, the same torchvision recipe) against
    ``gpufeed.stream``; the rungs that keep CIFAR-10's arrays do not apply and are left out."""
    if stream:
        return [
            Rung(STREAM_BASELINE, "torch", num_workers=0, floor=FP32),
            Rung(
                f"StreamingDataset in a DataLoader, num_workers={workers}, persistent",
                "torch",
                num_workers=workers,
                floor=FP32,
            ),  # fmt: skip
            *_gpufeed_rungs(STREAM),
            *_floors(),
        ]
    return [
        Rung(BASELINE, "torch", num_workers=0, floor=FP32),
        Rung(f"torchvision DataLoader, num_workers={workers}, persistent", "torch", num_workers=workers, floor=FP32),
        Rung(
            "deterministic part cached, random part per sample",
            "pretransform",
            num_workers=min(8, workers),
            floor=FP32,
            arrays_only=True,
        ),
        Rung(
            "dataset on the GPU, per sample through DataLoader, fp16",
            "gpu-per-sample",
            amp="fp16",
            gpu_only=True,
            arrays_only=True,
        ),
        *_gpufeed_rungs("gpufeed"),
        *_floors(),
    ]


def _gpufeed_rungs(name: str) -> list[Rung]:
    """gpufeed's loader (``gf.accelerate``, or ``gf.stream`` of a stream), then with AMP, then with CUDA graphs."""
    return [
        Rung(name, "gpufeed", floor=FP32),
        Rung(f"{name} + bf16 + channels_last", "gpufeed", amp="bf16", channels_last=True, floor=BF16),
        Rung(
            f"{name} + bf16 + channels_last + CUDA graphs",
            "gpufeed",
            amp="bf16",
            channels_last=True,
            cuda_graphs=True,
            floor=GRAPHED,
            gpu_only=True,
        ),
    ]


def _floors() -> list[Rung]:
    return [
        Rung(FP32, "fixed"),
        Rung(BF16, "fixed", amp="bf16", channels_last=True),
        Rung(GRAPHED, "fixed", amp="bf16", channels_last=True, cuda_graphs=True, gpu_only=True),
    ]


def sized_config(
    device: torch.device,
    model: str | None,
    train_size: int | None,
    test_size: int | None,
    batch_size: int,
    seed: int,
    data: str = "synthetic",
    image_size: int | None = None,
    val_data: str | None = None,
    **stream: Any,
) -> tuple[TrainConfig, str]:
    """Size the run to the machine: on a GPU the whole dataset (VGG16 on CIFAR-10, ResNet-50 on a folder or a
    stream), on a CPU a subset and the small model. The description has ``{n}`` for the number of training images.
    ``stream``: ``local``, ``cache_limit``, ``num_classes`` of an MDS dataset (:class:`TrainConfig`'s)."""
    from .data.images import is_folder
    from .data.mds import is_stream

    gpu, folder = device.type == "cuda", is_folder(data) or is_stream(data)
    cpu_sizes = (512, 256) if folder else (5_000, 1_000)
    cfg = TrainConfig(
        model=model or (("resnet50" if folder else "vgg16") if gpu else "small"),
        train_size=train_size if gpu else train_size or cpu_sizes[0],
        test_size=test_size if gpu else test_size or cpu_sizes[1],
        batch_size=batch_size,
        epochs=2,
        seed=seed,
        device=str(device),
        progress=False,
        data=data,
        val_data=val_data,
        image_size=image_size,
        **stream,
    )
    at = f" at {image_size or 224}x{image_size or 224}" if folder else ""
    if gpu:
        return cfg, f"{cfg.model}{at} on {{n}} images"
    full = f"ResNet-50 on the whole {'stream' if is_stream(data) else 'folder'}" if folder else "VGG16 on 50,000"
    return cfg, f"CPU run: {cfg.model} model{at} on a {{n}}-image subset so it finishes in minutes (on a GPU: {full})"


def run_bench(
    device: str | None = None,
    model: str | None = None,
    train_size: int | None = None,
    test_size: int | None = None,
    batch_size: int = 256,
    seed: int = 0,
    out: str | Path | None = None,
    log: Callable[[str], None] = print,
    only: list[str] | None = None,
    datasets: tuple[Any, Any] | None = None,
    on_row: Callable[[Row], None] | None = None,
    keep_going: bool = False,
    data: str = "synthetic",
    image_size: int | None = None,
    val_data: str | None = None,
    **stream: Any,
) -> list[Row]:
    """Run the ladder; print a table; write ``out/bench.json`` and ``out/bench.png``.

    ``only``: these rungs, in this order. ``data``, ``image_size``, ``val_data``: as ``gpufeed train``'s
    (default: the synthetic CIFAR-10 in gpufeed's cache directory); ``datasets``: ``(train, test)`` already
    loaded for ``data``. ``on_row``: called with each
    rung's row as soon as it is measured. ``keep_going``: a rung that fails is recorded (in
    ``skipped``) and the next one runs. ``stream``: ``local``, ``cache_limit``, ``num_classes`` of an MDS dataset
    (``data`` a URL or a directory with index.json; ``batch_size`` is then the global batch).
    """
    from .data.images import is_folder
    from .data.mds import is_stream
    from .train.loop import load_datasets, stream_sources

    dev = resolve_device(device)
    base, sizing = sized_config(
        dev, model, train_size, test_size, batch_size, seed, data, image_size, val_data, **stream
    )
    streamed = is_stream(data)
    if streamed:
        datasets = datasets or stream_sources(base)
        held = datasets[0].samples()  # None: a remote's, known once its index is fetched
        images = min(x for x in (base.train_size, held) if x is not None) if (base.train_size or held) else 0
    else:
        datasets = datasets or load_datasets(base)
        images = min(base.train_size or len(datasets[0]), len(datasets[0]))
    if not images:
        sizing = sizing.replace("{n} images", "the whole stream")
    elif batch_size > images:  # every rung drops its last, partial batch: its epochs would be empty
        raise ConfigError(
            f"batch_size={batch_size} is more than the {images:,} training images: every epoch would be empty (the "
            f"last, partial batch is dropped); use batch_size <= {images} (gpufeed bench --batch-size)"
        )
    sizing = sizing.format(n=f"{images:,}")
    kept = images // batch_size * batch_size
    dropped = f"; {images - kept:,} of them dropped by drop_last each epoch" if kept < images else ""
    per_epoch = f" ({images // batch_size:,} batches per epoch{dropped})" if images else ""
    log(f"gpufeed bench: {sizing}, batch {batch_size}{per_epoch}, 2 epochs per rung (the second is timed)")
    shown: list[bool] = []

    def show_plan(run: Any) -> None:  # once: the gpufeed rungs share the store and cache
        if getattr(run.loader, "plan", None) is not None and not shown:
            shown.append(True)
            log("  gpufeed's plan:\n" + "\n".join(f"    {line}" for line in str(run.loader.plan).splitlines()))

    rows: list[Row] = []
    by_name = {r.name: r for r in ladder(default_workers(), stream=streamed)}
    rungs = [by_name[n] for n in only if n in by_name] if only else list(by_name.values())
    for k, rung in enumerate(rungs, 1):
        if rung.gpu_only and dev.type != "cuda":
            rows.append(Row(rung.name, skipped="needs a CUDA device"))
        elif rung.arrays_only and is_folder(data):
            rows.append(Row(rung.name, skipped="CIFAR-10's arrays only (an image folder's images differ in size)"))
        if rows and rows[-1].name == rung.name:
            log(f"  [{k}/{len(rungs)}] skipped  {rung.name}: {rows[-1].skipped}")
            if on_row is not None:
                on_row(rows[-1])
            continue
        cfg = replace(
            base,
            loader=rung.loader,
            amp=rung.amp,
            channels_last=rung.channels_last,
            cuda_graphs=rung.cuda_graphs,
            num_workers=rung.num_workers,
        )
        started = time.perf_counter()
        try:
            records = train(cfg, datasets=datasets, on_ready=show_plan)
        except Exception as e:
            if not keep_going:
                raise
            rows.append(Row(rung.name, skipped=f"error: {type(e).__name__}: {e}"[:400]))
            log(f"  [{k}/{len(rungs)}] FAILED   {rung.name}: {rows[-1].skipped}")
            if on_row is not None:
                on_row(rows[-1])
            continue
        first, last = records[0], records[-1]
        rows.append(
            Row(
                rung.name,
                last.epoch_s,
                last.images_per_s,
                None,
                first.epoch_s,
                last.data_wait_fraction,
                last.gpu_util,
                last.peak_memory_bytes / 2**20 if last.peak_memory_bytes else None,
                last.test_acc,
                rung.floor,
            )
        )
        log(f"  [{k}/{len(rungs)}] {last.epoch_s:8.3f} s  {rung.name}  ({time.perf_counter() - started:.0f} s)")
        if on_row is not None:
            on_row(rows[-1])
    _relate(rows)
    log(format_table([asdict(r) for r in rows], _COLUMNS))
    log(summary(rows, dev))
    if out is not None:
        _write(Path(out), rows, dev, sizing, log)
    return rows


_COLUMNS = [
    ("name", "rung", "s"),
    ("epoch_s", "epoch s", ".3f"),
    ("images_per_s", "img/s", ",.0f"),
    ("speedup", "speedup", ".1f"),
    ("floor_ratio", "x floor", ".2f"),
    ("gpu_util", "GPU %", ".0f"),
    ("peak_memory_mib", "peak MiB", ",.0f"),
    ("first_epoch_s", "1st epoch s", ".2f"),
    ("test_acc", "test acc", ".3f"),
    ("skipped", "skipped", "s"),
]


def _baseline(rows: list[Row]) -> Row | None:
    """The plain DataLoader rung (whatever order the rungs ran in), else the first."""
    return next((r for r in rows if r.name in (BASELINE, STREAM_BASELINE)), rows[0] if rows else None)


def _relate(rows: list[Row]) -> None:
    by_name = {r.name: r for r in rows}
    first = _baseline(rows)
    base = first.epoch_s if first is not None and first.epoch_s else None
    for r in rows:
        if r.epoch_s is None:
            continue
        r.speedup = base / r.epoch_s if base else None
        floor = by_name.get(r.floor or "")
        r.floor_ratio = r.epoch_s / floor.epoch_s if floor and floor.epoch_s else None


def _best_dataloader(rows: list[Row]) -> Row | None:
    """The fastest plain DataLoader rung that ran (tuned workers usually), the fair comparison for gpufeed."""
    ran = [r for r in rows if r.name.startswith(("torchvision DataLoader", "StreamingDataset in")) and r.epoch_s]
    return min(ran, key=lambda r: r.epoch_s or 0.0) if ran else None


def summary(rows: list[Row], device: torch.device) -> str:
    """One sentence: what the ladder shows on this machine (data-bound or model-bound, the loader's share), gpufeed
    compared with the best DataLoader rung (not only with ``num_workers=0``)."""
    by_name = {r.name: r for r in rows if r.epoch_s is not None}
    first = _baseline(rows)
    ours_name = STREAM if STREAM in by_name else "gpufeed"
    base, ours, floor = (by_name.get(n) for n in (first.name if first else "", ours_name, FP32))
    if base is None or ours is None or floor is None or not (base.epoch_s and ours.epoch_s and floor.epoch_s):
        return "(too few rungs ran to say what limits training here)"
    best = _best_dataloader(rows) or base
    assert best.epoch_s is not None
    bound, why = _bound(base.epoch_s, base.data_wait_fraction or 0.0, floor.epoch_s)
    versus = f"{best.epoch_s / ours.epoch_s:.1f}x the best DataLoader rung ({best.name})"
    if best is not base:
        versus += f", {base.epoch_s / ours.epoch_s:.1f}x num_workers=0"
    return (
        f"On this {device.type.upper()}, the plain DataLoader epoch is {bound}: {why}; {ours_name} waits "
        f"{ours.data_wait_fraction or 0:.1%} and runs at {ours.epoch_s / floor.epoch_s:.2f}x the model alone "
        f"({versus})" + (": the model, not the data, is the cost here" if bound == "model-bound" else "") + "."
    )


def _bound(epoch_s: float, waiting: float, floor_s: float) -> tuple[str, str]:
    """``(verdict, why)`` of the plain DataLoader rung: data-bound when it waits for data at least
    :data:`~gpufeed.diagnose.DATA_BOUND_FRACTION` of its epoch, or when its epoch takes at least
    :data:`~gpufeed.diagnose.CONTENTION_SLOWDOWN` times the model alone while waiting less (its workers take the
    cores the step needs: on a CPU the wait hides the data's cost), as ``gf.diagnose``'s contention check judges.

    Example:
        >>> _bound(2.9, 0.15, 1.0)[0], _bound(1.1, 0.05, 1.0)[0], _bound(4.0, 0.6, 1.0)[0]
        ('data-bound', 'model-bound', 'data-bound')
    """
    slower = epoch_s / floor_s
    said = f"it waits for data {waiting:.0%} of its {epoch_s:.2f} s, where the model alone takes {floor_s:.2f} s"
    if waiting >= DATA_BOUND_FRACTION:
        return "data-bound", said
    if slower >= CONTENTION_SLOWDOWN:
        return "data-bound", (
            f"{said}, yet its epoch takes {slower:.1f}x the model alone: making the data takes the cores the step "
            "needs, a cost the wait does not show"
        )
    return "model-bound", said


def _write(out: Path, rows: list[Row], device: torch.device, sizing: str, log: Callable[[str], None]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = environment(device, sizing=sizing)
    (out / "bench.json").write_text(json.dumps({"environment": env, "rows": [asdict(r) for r in rows]}, indent=2))
    done = [r for r in rows if r.epoch_s is not None]
    waits = [r.epoch_s * (r.data_wait_fraction or 0) for r in done]  # type: ignore[operator]
    floor = next((r for r in done if r.name == FP32), None)
    bar_chart(
        out / "bench.png",
        [r.name for r in done],
        [
            ("waiting for data", waits, "#C44E52"),
            ("training step", [r.epoch_s - w for r, w in zip(done, waits, strict=True)], "#4C72B0"),  # type: ignore[operator]
        ],
        f"gpufeed bench: one training epoch ({sizing}). {summary(rows, device)}",
        "seconds per epoch (linear)",
        marks=[f"({r.floor_ratio:.2f}x its floor)" if r.floor_ratio else "" for r in done],
        lines=[(floor.epoch_s, f"model alone, fp32: {floor.epoch_s:.3g} s")] if floor and floor.epoch_s else [],
    )
    log(f"wrote {out / 'bench.json'} and {out / 'bench.png'}")
