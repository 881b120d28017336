"""Every GPU check of gpufeed in one run of at most 8 minutes on one GPU; writes OUT/gpu_check.json.

    pip wheel --no-deps airbench==0.1.8 -w .whl                    # here, once (.whl/ travels with carry)
    pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 -d .whl/hf datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19   # here, once
    PYTHONPATH=src python benchmarks/gpu_check.py --out "$OUT"     # on the GPU machine

The hf_datasets part's wheels (.whl/hf, 0.9 MB, pure Python) are what ``datasets`` needs beyond the GPU machine's
image, which holds pyarrow, pandas, huggingface_hub, fsspec, xxhash, pyyaml, tqdm and the rest (its package list);
they go first on ``sys.path`` and ``PYTHONPATH`` at the start, before any DataLoader worker, only where ``datasets``
is not installed (``_carried_wheels``; the JSON's ``datasets`` says which, the part's ``versions`` what it found).
Should that pyarrow prove too old for them, add ``pyarrow==26.0.1`` to the command (55 MB: the tree that travels
is then about 59 MB of its 64 MiB, airbench's 12 kB included; pandas, 12 MB more, would not fit as well).

Parts, most valuable first (``--parts`` runs a chosen few, in the order given):

1. ``prefetch_race``: a consumer far slower than the copies, per-batch checksums over 1,000
   batches; the same check on a prefetcher with ``record_stream`` disabled must find corruption
   (so the check can fail);
2. ``sync_free``: no host-device synchronisation in steady state (``set_sync_debug_mode("error")``);
3. ``loader_throughput``: gpufeed and airbench's ``CifarLoader`` first, then torchvision's
   ``DataLoader`` (slow) -- one row at a time;
3b. ``image_folder``: nvJPEG against PIL, both folder stores against DataLoader(16), a ResNet-50 epoch;
3b'. ``hf_datasets``: a ``datasets.Dataset`` of the same 2,000 photos (``save_to_disk``, ``load_from_disk``): the JPEG
   store's pixels, nvJPEG reading the memory-mapped Arrow bytes, against ``datasets``' PIL decoding (and against the
   same files from the folder and from the loader's store), the store's bytes a view of the Arrow buffer, then
   ``with_transform`` + DataLoader(16) against the pixel and JPEG stores;
3b''. ``stream_loader``: ``gf.stream`` over MDS shards (nvJPEG) against the JPEG store on the same photos, local and
   cold from a local-directory remote, the first batch at 1,000 shards; its CUDA batches finite and of the right
   shape; each sample's augmented output the same served by 2 simulated ranks as by 1 (keyed draws on CUDA);
3c. ``augment_recipes``: TrivialAugmentWide, RandAugment, AutoAugment, a SimCLR view against
   DataLoader(16), and each one's cost per batch against a ResNet-50 bf16 step at 224;
3d. ``image_sizes``: crop + flip + Normalize at 32, 64, 128, 224 and 256 px against DataLoader(16)
   (and airbench's ``CifarLoader`` at 32), each row's fraction of the device's converting-copy bandwidth;
4. ``bench_ladder``: VGG16 on 50,000 images, the gpufeed rungs and the model-alone floors first,
   the slow ``DataLoader`` rungs last -- one rung at a time;
5. ``cuda_tests``: the CUDA-marked tests; 6. ``tier_fallback``: the memory-cap fallback to pinned
   memory (same batches); 7. ``ddp_overhead``: one GPU under ``torchrun``; 8. ``accelerate_tiers``;
   9. ``tune``: ``tune_dataloader`` against the rule of thumb on 16 cores; 10. ``diagnose_script``:
   ``gpufeed diagnose --verify -- python train.py`` on an unmodified CIFAR-style script on the device (CUDA events
   per step, NVML samples, the side measurement of accelerate against the script's DataLoader on the GPU, the
   predicted speed-up of the loop against the changed copy's, run on the device).

Each part has its own time limit (and all of them one budget, ``--budget``); the JSON is rewritten
after every part, every loader row and every ladder rung, so a run cut short keeps what it did, and
an exception in a part or a row is recorded and the next one runs. ``--cpu-rehearsal`` runs every
part that can run on a CPU, at small sizes, in under 3 minutes (CI runs it: tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch._inductor.config

ROOT = Path(__file__).resolve().parent.parent
# DataLoader workers and the subprocess parts import from both; what was there (carried wheels) stays after them.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT / "src"), str(ROOT / "benchmarks"), *filter(None, [os.environ.get("PYTHONPATH")])]
)
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpufeed as gf  # noqa: E402
from gpufeed import augment as A  # noqa: E402

from harness import environment  # noqa: E402

# Seconds each part may take at most (the budget's remainder, if smaller).
LIMITS = {
    "prefetch_race": 60,
    "sync_free": 45,
    "loader_throughput": 150,
    "image_folder": 90,
    "hf_datasets": 90,
    "stream_loader": 120,
    "augment_recipes": 75,
    "image_sizes": 90,
    "bench_ladder": 240,
    "cuda_tests": 150,
    "tier_fallback": 90,
    "ddp_overhead": 120,
    "accelerate_tiers": 120,
    "tune": 100,
    "diagnose_script": 180,  # the script as it is, then A B B A with the change (--verify; the second pair if it fits)
    "launches": 90,
}
GPU_ONLY = ("sync_free", "cuda_tests", "tier_fallback")


class Check:
    """The run's state: where it writes, how small it runs, and the summary written after each step."""

    def __init__(self, out: Path, rehearsal: bool, n: int) -> None:
        self.out, self.small, self.n = out, rehearsal, n
        self.device = "cpu" if rehearsal else "cuda"
        self.summary: dict = {}

    def save(self) -> None:
        # Written aside and renamed: a run killed mid-write still leaves the previous complete summary.
        path = self.out / "gpu_check.json"
        partial = path.with_suffix(".json.partial")
        partial.write_text(json.dumps(self.summary, indent=2, default=str))
        os.replace(partial, path)


class PartTimeout(BaseException):
    """A part's time is up. Not an Exception: code that records an error and goes on must not swallow it."""


def _run(cmd: list[str], timeout: float | None = None, **kwargs: object) -> subprocess.CompletedProcess:
    """``subprocess.run`` in a session of its own, killed as a whole group when the part's time is up (or on any
    error): torchrun's workers, started by the command, must not go on using the GPU during the next parts."""
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _alarm(signum: int, frame: object) -> None:
    raise PartTimeout


# -- the parts ---------------------------------------------------------------------------------------------------


def prefetch_race(c: Check) -> dict:
    from race import race_check

    batches = 200 if c.small else 1000
    good = race_check(c.device, batches=batches)
    if c.device != "cuda":  # on the CPU prefetch passes batches through: nothing to race
        return {"correct": good, "ok": good["ok"]}
    broken = race_check(c.device, batches=300, broken=True)
    return {"correct": good, "broken": broken, "ok": good["ok"] and broken["corrupted"] > 0}


def sync_free(c: Check) -> dict:
    res = {}
    aug = A.Compose([A.RandomCrop(32, padding=4), A.RandomHorizontalFlip(), A.Normalize([0.5] * 3, [0.25] * 3)])
    images = torch.randint(0, 256, (20_000, 3, 32, 32), dtype=torch.uint8)
    loader = gf.DeviceLoader(
        images, torch.randint(0, 10, (20_000,)), 256, transform=aug, device="cuda", dtype=torch.bfloat16
    )
    list(loader)  # warm-up: constants cached on the device
    source = [(torch.rand(256, 3, 32, 32), torch.arange(256)) for _ in range(20)]
    list(gf.prefetch(source, device="cuda"))
    for name, make in [("DeviceLoader", lambda: loader), ("prefetch", lambda: gf.prefetch(source, device="cuda"))]:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            res[name] = {"ok": True, "batches": sum(1 for _ in make())}
        except RuntimeError as e:
            res[name] = {"ok": False, "error": str(e)[:500]}
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return res


def loader_throughput(c: Check) -> dict:
    import loader_throughput as lt

    args = lt.parse(
        ["--n", str(c.n), "--workers", "0,2" if c.small else "0,16", "--repeats", "1" if c.small else "5"]
        + ["--torch-repeats", "1", "--device", c.device]
    )
    plans = lt.plans(args, torch.device(c.device))
    dataloader_rows = [p for p in plans if p[0].startswith("torchvision")]
    result: dict = {"environment": lt.env_of(args, torch.device(c.device)), "rows": []}
    c.summary["loader_throughput"] = result
    for name, measure in [p for p in plans if p not in dataloader_rows] + dataloader_rows:  # slow rows last
        t = time.perf_counter()
        try:
            row = measure()
            result["rows"].append(row.row(None) if row is not None else {"name": name, "skipped": "not importable"})
        except Exception:  # (not the part's PartTimeout, a BaseException)
            result["rows"].append({"name": name, "error": traceback.format_exc()[-1500:]})
        print(f"  {name}: {time.perf_counter() - t:.1f} s", flush=True)
        c.save()
    base = next(
        (r for r in result["rows"] if r.get("name", "").startswith("torchvision DataLoader, num_workers=0")), None
    )
    for r in result["rows"]:
        if base and "epoch_s" in r and "epoch_s" in base:
            r["speedup"] = round(base["epoch_s"] / r["epoch_s"], 2)
    return result


def image_folder(c: Check) -> dict:
    """A folder of JPEGs around 375x500 with RandomResizedCrop(224) + flip + normalise: nvJPEG's pixels against
    PIL's, each store against DataLoader(num_workers=16) with PIL, a ResNet-50 epoch against the model alone."""
    import image_folder as folder_bench

    small = ["--n", "64", "--size", "64", "--batch", "16", "--compare", "8", "--model", "resnet18"]
    full = ["--n", "2000", "--batch", "256", "--compare", "100", "--model", "resnet50"]
    folder_bench.main(
        ["--device", c.device, "--workers", "2" if c.small else "16", "--repeats", "1" if c.small else "2"]
        + (small if c.small else full)
        + ["--out", str(c.out)]
    )
    return json.loads((c.out / "image_folder.json").read_text())


def hf_datasets(c: Check) -> dict:
    """A ``datasets.Dataset`` of the image_folder part's 2,000 photos (embedded bytes, a ClassLabel; save_to_disk,
    then load_from_disk: one memory-mapped Arrow file) through ``gf.accelerate`` (benchmarks/hf_datasets.py): the
    JPEG store's first 100 images decoded on the device (nvJPEG reading the Arrow mapping itself) against
    ``datasets``' own PIL decoding, the same files from the folder and the loader's placed store (the Arrow view,
    unpinned on CUDA), whether the store's bytes lie inside the Arrow buffer, and
    ``DataLoader(ds.with_transform(fn), 16)`` against the pixel store and the JPEG store, RandomResizedCrop(224) +
    flip + normalise at batch 256."""
    if c.summary.get("datasets") is None:
        return {"skipped": f"datasets is not installed and no wheels are carried ({_HF_WHEELS}): see the docstring"}
    import importlib.metadata

    import hf_datasets as hf

    versions = {}
    for name in ("datasets", "pyarrow", "pandas", "huggingface_hub", "fsspec", "dill", "multiprocess"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    c.summary["hf_datasets"] = {"versions": versions}  # recorded even if the import fails
    # 64 photos: the image_folder rehearsal's folder, so it is generated once
    small = ["--n", "64", "--size", "64", "--batch", "16", "--compare", "8", "--workers", "1", "--repeats", "1"]
    full = ["--n", "2000", "--batch", "256", "--compare", "100", "--workers", "16", "--repeats", "3"]
    hf.main(["--device", c.device, "--out", str(c.out)] + (small if c.small else full))
    result = json.loads((c.out / f"hf_datasets_photos_{64 if c.small else 224}.json").read_text())
    result["versions"] = versions
    folder = c.summary.get("image_folder")
    if isinstance(folder, dict) and "decoded_vs_pil" in folder:  # nvJPEG on the folder's files, for comparison
        result["image_folder_decoded_vs_pil"] = folder["decoded_vs_pil"]
    fidelity, copies = result["decoded_vs_pil"], result["zero_copy"]
    images = fidelity["images"]
    # the CPU decoders give PIL's pixels; nvJPEG does not (a few levels), but it must give the same pixels from the
    # Arrow mapping as from the folder's files and from the loader's store
    refused = any("refused" in w for w in fidelity["warnings"])  # nvJPEG refused the chunk: PIL's pixels instead
    decoded = fidelity["max_levels"] == 0 if c.device == "cpu" else "cuda" in fidelity["decoder"] and not refused
    same = fidelity["same_as_folder_files"] == images and fidelity["same_as_served"] == images
    # Encoded.placed leaves a memory-mapped store unpinned on CUDA (pinning would copy the column): the loader
    # serves the Arrow view on both devices, and nvJPEG copies in from pageable memory
    served = copies["served_on_arrow"] and not copies["served_pinned"]
    result["ok"] = bool(decoded and same and copies["built_on_arrow"] and served and not copies["bad_images"])
    return result


def stream_loader(c: Check) -> dict:
    """gf.stream (nvJPEG) against the JPEG store on the same 2,000 photos (the image_folder part's folder) and
    recipe, side by side (benchmarks/stream_throughput.py: local shards, a cold first epoch from a local-directory
    remote, the first batch at 1,000 shards in a fresh process, DataLoader(16) over StreamingDataset with PIL); then
    the first global batches served by one rank and by two simulated ranks: same samples, same pixels, finite; an
    evaluation recipe against torchvision's pixels, a ragged per-sample part, and the host syncs of a few batches."""
    import shutil

    import stream_throughput as st

    work = Path(tempfile.mkdtemp(prefix="gpufeed-stream-check-"))  # shards and caches: not under OUT (sent back)
    small = ["--n", "64", "--scale", "0.25", "--size", "64", "--batch", "16", "--repeats", "1", "--workers", "1"]
    small += ["--index-shards", "50", "--first-batch", "here", "--no-profile"]
    full = ["--n", "2000", "--repeats", "3", "--workers", "16", "--index-shards", "1000"]
    try:
        st.main(["--device", c.device, "--out", str(c.out), "--work", str(work)] + (small if c.small else full))
        result = json.loads((c.out / "stream_throughput.json").read_text())
        c.summary["stream_loader"] = result
        c.save()
        size, batch = (64, 16) if c.small else (224, 256)
        result["layout"] = st.same_by_layout(work / "mds", c.device, size, global_batch=batch, batches=2)
        result["checks"] = st.evaluation_and_syncs(work / "mds", c.device, size, batch)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["ok"] = result["layout"]["ok"] and result["checks"]["ok"]  # the speed goals are in result["goals"]
    return result


def augment_recipes(c: Check) -> dict:
    """TrivialAugmentWide, RandAugment, AutoAugment and a SimCLR view batched on the GPU against DataLoader(16)
    with the PIL pipeline (CIFAR-sized), and each one's cost per batch of 256 at 224 against a ResNet-50 bf16
    channels_last training step (goal: under 10%)."""
    import augment_recipes as recipes

    small = ["--n", "128", "--batch", "64", "--workers", "0", "--repeats", "1", "--cost", "32,8,resnet18"]
    full = ["--n", "10000", "--batch", "256", "--workers", "16", "--repeats", "3", "--cost", "224,256,resnet50"]
    recipes.main(["--device", c.device, "--out", str(c.out)] + (small if c.small else full))
    return json.loads((c.out / "augment_recipes.json").read_text())


def image_sizes(c: Check) -> dict:
    """The loader at 32-256 px against DataLoader(16) with PIL, bytes per second against a converting copy of
    the same bytes on the device (goal: within 2x), airbench's CifarLoader at 32 px."""
    import image_sizes as sizes

    small = ["--sizes", "32,64", "--pixels", str(600 * 32 * 32), "--batch-size", "64", "--workers", "1"]
    full = ["--sizes", "32,64,128,224,256", "--workers", "16", "--repeats", "3"]
    sizes.main(["--device", c.device, "--out", str(c.out), "--repeats", "1"] + (small if c.small else full))
    return json.loads((c.out / "image_sizes.json").read_text())


def bench_ladder(c: Check) -> dict:
    from dataclasses import asdict

    from gpufeed.bench import BASELINE, ladder, run_bench
    from gpufeed.workers import default_workers

    names = [r.name for r in ladder(default_workers())]
    slow = [n for n in names if n.startswith(("torchvision", "deterministic", "dataset on the GPU"))]
    order = [n for n in names if n not in slow] + slow  # gpufeed rungs and floors first, slow ones last
    if c.small:  # the rehearsal: one rung of each kind (each rung's code is tested by tests/test_bench.py)
        order = [order[0], next(n for n in order if n.startswith("model alone")), *slow[1:2], slow[-1]]
    result: dict = {"order": order, "rows": []}
    c.summary["bench_ladder"] = result

    def on_row(row: object) -> None:
        result["rows"].append(asdict(row))  # type: ignore[call-overload]
        c.save()

    run_bench(
        c.device,
        out=c.out / "bench",
        log=lambda line: print(line, flush=True),
        train_size=512 if c.small else None,
        test_size=256 if c.small else None,
        only=order,
        on_row=on_row,
        keep_going=True,
    )
    result["baseline"] = BASELINE
    return json.loads((c.out / "bench" / "bench.json").read_text()) | {"order": order}


def cuda_tests(c: Check) -> dict:
    t = time.perf_counter()
    r = _run(
        [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", str(ROOT / "tests")],
        timeout=LIMITS["cuda_tests"] - 5,
        cwd=ROOT,
    )
    (c.out / "pytest_cuda.txt").write_text(r.stdout + r.stderr)
    return {
        "returncode": r.returncode,
        "summary": (r.stdout.strip().splitlines() or [""])[-1],
        "seconds": round(time.perf_counter() - t, 1),
    }


_TIER_SCRIPT = """
import json, sys, warnings, torch
import torchvision.transforms.v2 as v2
from torch.utils.data import TensorDataset
import gpufeed as gf
images, labels = torch.load(sys.argv[2], mmap=True)  # generated once, while the first parts ran
tf = v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True),
                 v2.Normalize([0.5] * 3, [0.25] * 3)])
if sys.argv[1] != "none":
    torch.cuda.set_per_process_memory_fraction(float(sys.argv[1]))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loader = gf.accelerate(TensorDataset(images, labels), device="cuda", seed=1, cache=False, progress=False,
                           transform=tf)
it = iter(loader)
sums = [float(next(it)[0].double().sum()) for _ in range(20)]
print(json.dumps({"storage": loader.plan.storage, "warnings": [str(w.message) for w in caught], "sums": sums}))
"""


class _TierData:
    """600 MB of uint8 images for the memory-cap check, generated in the background from the start."""

    def __init__(self) -> None:
        self.path = Path(tempfile.gettempdir()) / f"gpufeed-gpu-check-tiers-{os.getpid()}.pt"
        self.thread = threading.Thread(target=self._make, daemon=True)
        self.thread.start()

    def _make(self) -> None:
        # Over the capped budget (0.006 x 141 GB / 2 = 420 MB), while the cap still leaves room for a
        # chunk's working memory (about 300 MB).
        g = torch.Generator().manual_seed(0)
        images = torch.randint(0, 256, (200_000, 3, 32, 32), dtype=torch.uint8, generator=g)
        torch.save((images, torch.randint(0, 10, (200_000,), generator=g)), self.path)

    def ready(self) -> Path:
        self.thread.join()
        return self.path


def tier_fallback(c: Check, data: _TierData) -> dict:
    """Under a small per-process memory cap the data goes to pinned host memory: same batches, one warning."""
    runs = {}
    path = data.ready()
    for cap in ("none", "0.006"):
        r = _run([sys.executable, "-c", _TIER_SCRIPT, cap, str(path)])
        if r.returncode:
            return {"error": r.stderr[-2000:]}
        runs[cap] = json.loads(r.stdout.strip().splitlines()[-1])
    same = runs["none"]["sums"] == runs["0.006"]["sums"]
    return {
        "uncapped": runs["none"]["storage"],
        "capped": runs["0.006"]["storage"],
        "capped_warnings": runs["0.006"]["warnings"],
        "identical_batches": same,
        "ok": same and runs["none"]["storage"] == "device" and runs["0.006"]["storage"] == "pinned",
    }


def accelerate_tiers(c: Check) -> dict:
    import accelerate_tiers as at

    at.main(
        ["--device", c.device, "--workers", "2" if c.small else "16", "--repeats", "1" if c.small else "5"]
        + ["--out", str(c.out)]
        + (["--n", "1000"] if c.small else [])
    )
    return json.loads((c.out / "accelerate_tiers.json").read_text())


def tune(c: Check) -> dict:
    import tune_throughput as tt

    tt.main(
        ["--device", c.device, "--budget", "2" if c.small else "45", "--n", "2000" if c.small else "20000"]
        + ["--repeats", "1" if c.small else "2", "--out", str(c.out)]
    )
    return json.loads((c.out / "tune_throughput.json").read_text())


def ddp_overhead(c: Check) -> dict:
    """One GPU: the same run plain and under torchrun --nproc-per-node 1 (NCCL, DDP); last-epoch times."""
    epochs = "1" if c.small else "3"  # the last epoch is the measured one; the rehearsal checks the path
    base = [sys.executable, "-m", "gpufeed", "train", "--model", "small" if c.small else "resnet9", "--epochs", epochs]
    base += ["--amp", "bf16", "--channels-last", "--no-progress", "--device", c.device]
    if c.small:
        base += ["--train-size", "512", "--test-size", "128"]
    res = {}
    for name, extra in [("plain", []), ("torchrun_1", ["--nproc-per-node", "1"])]:
        r = _run([*base, *extra, "--out", str(c.out / f"ddp_{name}")])
        if r.returncode:
            return {"error": f"{name}: {r.stderr[-2000:]}"}
        epochs = json.loads((c.out / f"ddp_{name}" / "train.json").read_text())["epochs"]
        res[name] = {"epoch_s": [e["epoch_s"] for e in epochs], "test_acc": epochs[-1]["test_acc"]}
    res["overhead"] = res["torchrun_1"]["epoch_s"][-1] / res["plain"]["epoch_s"][-1] - 1
    return res


_DIAGNOSED_SCRIPT = """
import sys, torch, torchvision, torchvision.transforms as T
from torch.utils.data import DataLoader
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                T.Normalize((0.49, 0.48, 0.45), (0.25, 0.24, 0.26))])
data = torchvision.datasets.FakeData(int(sys.argv[1]), (3, 32, 32), 10, transform=tf, random_offset=1)
loader = DataLoader(data, batch_size=256, shuffle=True, num_workers=int(sys.argv[2]), pin_memory=device == "cuda")
model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(32, 10)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(100):
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
print("loss", float(loss))
"""


def diagnose_script(c: Check) -> dict:
    """An unmodified script under ``gpufeed diagnose --verify --``: the verdict, CUDA-event step times, NVML samples,
    the side measurement (accelerate on the device against the script's own DataLoader), the loop's predicted
    speed-up, and the changed copy run for the same steps on the device (verified against the prediction), from its
    report.json."""
    script = c.out / "diagnosed_train.py"
    script.write_text(_DIAGNOSED_SCRIPT)
    out = c.out / "diagnose"
    n, workers, steps = ("768", "0", "4") if c.small else ("20000", "4", "60")
    # on the device A B B A (2 runs a side: a spread), the second pair only when it fits in the check's limit; one
    # pair in the rehearsal (the path, not figures)
    runs = "2" if c.small else "4"
    cmd = [sys.executable, "-m", "gpufeed", "diagnose", "--verify", "--verify-runs", runs, "--verify-seconds", "100"]
    cmd += ["--steps", steps, "--out", str(out), "--"]
    env = {**os.environ, "GPUFEED_WATCH_SIDE_SECONDS": "2" if c.small else "20"}  # the rehearsal: the path, not figures
    r = _run([*cmd, sys.executable, str(script), n, workers], timeout=LIMITS["diagnose_script"] - 5, cwd=ROOT, env=env)
    (c.out / "diagnose_stdout.txt").write_text(r.stdout + r.stderr)
    if not (out / "report.json").exists():
        return {"returncode": r.returncode, "error": (r.stdout + r.stderr)[-2000:]}
    report = json.loads((out / "report.json").read_text())
    keep = ("verdict", "data_wait_fraction", "device", "exit", "side", "code_change", "notes", "slowest_rank")
    keep += ("prediction", "verify")
    return {"returncode": r.returncode, **{k: report.get(k) for k in keep}, "keys": sorted(report)}


# -- the run -----------------------------------------------------------------------------------------------------


def launches(c: Check) -> dict:
    """Per recipe of benchmarks/launches.py at 32 px, batch 256: the launching operators counted on the device path
    (the CPU's count), the CUDA kernels the profiler saw for one batch, the time per batch, and whether the recipe
    captures in a CUDA graph (its generator registered) and replays. On the CPU rehearsal: the counts only."""
    import launches as counts

    size, batch = 32, 64 if c.small else 256
    x = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, device=c.device)
    result: dict = {"size": size, "batch": batch, "recipes": {}}
    # first: its first call compiles ColorJitter's fused kernels for the device (the counts below reuse them)
    from gpufeed.augment import fusion

    with fusion.foreground():  # compiled at the first call (in a loader: in the background), so that it is timed
        result["fused_vs_eager"] = _fused_vs_eager(c.device, 64 if c.small else 224, 8 if c.small else 64)
        result["resize_fused_vs_eager"] = _resize_fused_vs_eager(c.device, 64 if c.small else 224, 8 if c.small else 64)
        result["device_vs_cpu"] = _device_vs_cpu(c.device, 16 if c.small else 256)
    for name, recipe in counts.recipes(size).items():
        with torch._inductor.config.patch(fx_graph_cache=False):  # a fused op counted as the kernels it generates
            dispatched = counts.count(recipe, x).total
        row: dict = {"dispatched": dispatched, "goal": counts.GOALS.get(name)}
        result["recipes"][name] = row
        if c.device == "cuda":
            row.update(_cuda_launches(recipe, x))
        c.save()
    return result


def _fused_vs_eager(device: str, size: int, batch: int) -> dict:
    """ColorJitter(0.4, 0.4, 0.4, 0.1) fused (compiled: Triton on a GPU) against its eager ops on the same device and
    against the CPU's eager ops, given the same parameters (issue 31: bit for bit on the CPU, tests/augment/
    test_fusion.py; Triton's division and fused multiply-adds may round otherwise: counted here), and the time to
    compile it and to run it."""
    from gpufeed.augment import ColorJitter, fusion
    from gpufeed.device import sync

    if not fusion.compiling(torch.device(device)):
        return {"skipped": "GPUFEED_COMPILE=0 or no compiler"}
    op = ColorJitter(0.4, 0.4, 0.4, 0.1)
    x = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    params = op.sample(x, torch.Generator().manual_seed(1))
    on = {k: ([f.to(device) for f in v] if k == "factors" else v.to(device)) for k, v in params.items()}
    xd = x.to(device)
    t = time.perf_counter()
    fused = op.apply(xd, on)
    sync(torch.device(device))
    first = time.perf_counter() - t
    with fusion.eager():
        eager = op.apply(xd, on)
        cpu = op.apply(x, params)
    t = time.perf_counter()
    for _ in range(10):
        op.apply(xd, on)
    sync(torch.device(device))
    fused_ms = (time.perf_counter() - t) / 10 * 1e3
    with fusion.eager():
        t = time.perf_counter()
        for _ in range(10):
            op.apply(xd, on)
        sync(torch.device(device))
    eager_ms = (time.perf_counter() - t) / 10 * 1e3

    def diff(a: torch.Tensor, b: torch.Tensor) -> dict:
        d = (a.cpu().int() - b.cpu().int()).abs()
        return {"max_levels": int(d.max()), "differing": int((d > 0).sum()), "values": d.numel()}

    times = {"first_call_s": round(first, 2), "fused_ms": round(fused_ms, 3), "eager_ms": round(eager_ms, 3)}
    return {"size": size, "batch": batch, "vs_eager_same_device": diff(fused, eager), "vs_cpu_eager": diff(fused, cpu),
            **times}  # fmt: skip


def _resize_fused_vs_eager(device: str, size: int, batch: int) -> dict:
    """RandomResizedCrop(size) + horizontal flip + Normalize as one fused op (gpufeed.augment.taps, compiled: Triton
    on a GPU) from images 32 px larger, against the taps' arithmetic eager on the same device and against the CPU's
    fused result, given the same boxes and flips (bit for bit on the CPU: tests/augment/test_fusion.py), in float
    values differing; against the ops one by one, eager (the taps eager: 0 on the CPU, issue 45); the time to
    compile and to run it, fused and the four ops eager."""
    from gpufeed.augment import RandomResizedCrop, fusion, taps
    from gpufeed.device import sync

    dev = torch.device(device)
    if not fusion.compiling(dev):
        return {"skipped": "GPUFEED_COMPILE=0 or no compiler"}
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    crop = RandomResizedCrop(size)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (batch, 3, size + 32, size + 32), dtype=torch.uint8, generator=g)
    params, mask = crop.sample(x, g), torch.rand(batch, generator=g) < 0.5
    xd, on, maskd = x.to(dev), {k: v.to(dev) for k, v in params.items()}, mask.to(dev)

    def fused(images: torch.Tensor, p: dict, m: torch.Tensor) -> torch.Tensor:
        return crop.apply_tail(images, p, [("cols", m)], (mean, std, False))

    def eager_ops() -> torch.Tensor:  # the ops one by one, eager: the taps, the flip, Normalize
        with fusion.eager():
            out = crop.apply(xd, on)
        out = torch.where(maskd.view(-1, 1, 1, 1), out.flip(3), out)
        return (out.float() / 255 - torch.tensor(mean, device=dev).view(1, 3, 1, 1)) / torch.tensor(
            std, device=dev
        ).view(1, 3, 1, 1)

    t = time.perf_counter()
    ours = fused(xd, on, maskd)
    sync(dev)
    first = time.perf_counter() - t
    box = (on[k] for k in ("top", "left", "height", "width"))
    tables = taps.tables(xd, *box, crop.size, crop.antialias, crop.interpolation, [("cols", maskd)])
    by_taps = taps.taps_resample(xd, *tables, *taps.normalizing(mean, std, 3, size, dev))
    cpu = fused(x, params, mask)

    def timed(fn: Callable[[], torch.Tensor]) -> float:
        fn()
        sync(dev)
        t = time.perf_counter()
        for _ in range(10):
            fn()
        sync(dev)
        return round((time.perf_counter() - t) / 10 * 1e3, 3)

    def diff(a: torch.Tensor, b: torch.Tensor) -> dict:
        d = (a.cpu() - b.cpu()).abs()
        return {"max_abs": float(d.max()), "differing": int((d > 0).sum()), "values": d.numel()}

    return {"size": size, "batch": batch, "vs_eager_taps_same_device": diff(ours, by_taps),
            "vs_cpu_fused": diff(ours, cpu), "vs_eager_ops": diff(ours, eager_ops()), "first_call_s": round(first, 2),
            "fused_ms": timed(lambda: fused(xd, on, maskd)), "eager_ops_ms": timed(eager_ops)}  # fmt: skip


def _device_vs_cpu(device: str, batch: int) -> dict:
    """Each recipe on the device (its fused functions where a compiler runs: .moves, .taps, .jitter, .auto_fused)
    against the same recipe on the CPU's host path, with draws keyed per sample (the same on both devices): values
    differing and the largest difference. Expected: 0 (RandomResizedCrop's taps, compiled or eager, are one arithmetic
    on the CPU: what differs is Triton's against the CPU's)."""
    from gpufeed.augment import (
        ColorJitter,
        Compose,
        KeyedDraws,
        Normalize,
        RandAugment,
        RandomCrop,
        RandomHorizontalFlip,
        RandomResizedCrop,
        TrivialAugmentWide,
    )

    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    crop = [RandomCrop(32, padding=4), RandomHorizontalFlip()]
    recipes = {
        "gray crop+flip+Normalize((0.1307,), (0.3081,))": (1, Compose([*crop, Normalize((0.1307,), (0.3081,))])),
        "crop+flip+normalise": (3, Compose([*crop, Normalize(mean, std)])),
        "ColorJitter+crop+flip+normalise": (3, Compose([ColorJitter(0.4, 0.4, 0.4, 0.1), *crop, Normalize(mean, std)])),
        "crop+flip+TrivialAugmentWide+normalise": (3, Compose([*crop, TrivialAugmentWide(), Normalize(mean, std)])),
        "crop+flip+RandAugment(2,9)+normalise": (3, Compose([*crop, RandAugment(2, 9), Normalize(mean, std)])),
        "RandomResizedCrop+flip+normalise": (3, Compose([RandomResizedCrop(32), RandomHorizontalFlip(),
                                                         Normalize(mean, std)])),
    }  # fmt: skip
    ids = torch.arange(batch)
    out = {}
    for name, (channels, recipe) in recipes.items():
        g = torch.Generator().manual_seed(len(name))
        x = torch.randint(0, 256, (batch, channels, 32, 32), dtype=torch.uint8, generator=g)
        try:
            ours = recipe(x.to(device), generator=KeyedDraws(7, 0, ids.to(device))).cpu()
            theirs = recipe(x, generator=KeyedDraws(7, 0, ids))
            d = (ours.double() - theirs.double()).abs()
            out[name] = {"differing": int((d > 0).sum()), "values": d.numel(), "max_abs": float(d.max())}
        except Exception as e:  # recorded, and the next recipe runs
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return out


def _cuda_launches(recipe: Callable, x: torch.Tensor) -> dict:
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(3):
        recipe(x, generator=g)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        recipe(x, generator=g)
        torch.cuda.synchronize()
    kernels = sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        recipe(x, generator=g)
    end.record()
    torch.cuda.synchronize()
    row: dict = {"cuda_kernels": kernels, "ms_per_batch": round(start.elapsed_time(end) / 20, 3)}
    try:
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(g)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            recipe(x, generator=g)
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            out = recipe(x, generator=g)
        graph.replay()
        torch.cuda.synchronize()
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        row["graph"] = {"captured": True, "finite": bool(torch.isfinite(out.float()).all()),
                        "ms_per_batch": round(start.elapsed_time(end) / 20, 3)}  # fmt: skip
    except Exception as e:  # recorded: which recipes do not capture, and why
        row["graph"] = {"captured": False, "error": f"{type(e).__name__}: {e}"[:500]}
    return row


def _airbench() -> str | None:
    wheels = sorted((ROOT / ".whl").glob("airbench-*.whl"))
    if not wheels:
        return None
    target = Path(tempfile.mkdtemp(prefix="airbench-"))
    zipfile.ZipFile(wheels[-1]).extractall(target)
    sys.path.insert(0, str(target))
    return wheels[-1].name


_HF_WHEELS = ROOT / ".whl" / "hf"


def _carried_wheels(module: str, folder: Path) -> str | None:
    """``module`` importable: as installed (its version, nothing changed), else from the wheels carried in ``folder``,
    unzipped into a temporary directory put first on ``sys.path`` and ``PYTHONPATH`` (a DataLoader's forkserver,
    started later, and the subprocess parts see it too); None when neither. Nothing is imported here."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec(module) is not None:
        try:
            return f"installed {importlib.metadata.version(module)}"
        except importlib.metadata.PackageNotFoundError:
            return "installed"
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        return None
    target = Path(tempfile.mkdtemp(prefix=f"{module}-wheels-"))
    for wheel in wheels:
        zipfile.ZipFile(wheel).extractall(target)
    sys.path.insert(0, str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(target), *filter(None, [os.environ.get("PYTHONPATH")])])
    importlib.invalidate_caches()
    return f"carried: {', '.join(w.name for w in wheels)}"


def _shm() -> str:
    r = subprocess.run(["df", "-h", "/dev/shm"], capture_output=True, text=True)
    return (r.stdout or r.stderr).strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--n", type=int, default=50_000)
    p.add_argument("--parts", nargs="*", default=None, help="run these parts, in this order (default: all)")
    p.add_argument("--budget", type=float, default=480, help="seconds for all parts together")
    p.add_argument("--cpu-rehearsal", action="store_true", help="the CPU-capable parts on the CPU, small")
    p.add_argument(
        "--no-time-limits",
        action="store_true",
        help="run every part to its end, ignoring LIMITS and --budget (CI's rehearsal: its sizes bound its work, "
        "and a loaded machine must not fail it by the clock)",
    )
    args = p.parse_args(argv)
    c = Check(args.out, args.cpu_rehearsal, 2000 if args.cpu_rehearsal else args.n)
    args.out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    c.summary["environment"] = environment(torch.device(c.device), images=c.n, shm=_shm())
    c.summary["warnings"] = []
    c.summary["airbench"] = _airbench()
    if c.summary["airbench"] is None and not c.small:
        c.summary["warnings"].append(
            "airbench wheel missing (.whl/airbench-*.whl): its row is skipped; build it with "
            "`pip wheel --no-deps airbench==0.1.8 -w .whl` and carry .whl"
        )
    # before any part starts a DataLoader's forkserver: its workers must find the carried wheels too
    c.summary["datasets"] = _carried_wheels("datasets", _HF_WHEELS)
    if c.summary["datasets"] is None and not c.small:
        c.summary["warnings"].append(
            f"datasets is not installed and no wheels are carried ({_HF_WHEELS}): the hf_datasets part is skipped; "
            "download them as the docstring says and carry .whl"
        )
    print(json.dumps(c.summary, indent=1), flush=True)  # versions and /dev/shm first
    c.save()
    tier_data = _TierData() if not c.small and (args.parts is None or "tier_fallback" in args.parts) else None
    parts: dict[str, Callable[[Check], dict]] = {
        "prefetch_race": prefetch_race,
        "sync_free": sync_free,
        "loader_throughput": loader_throughput,
        "image_folder": image_folder,
        "hf_datasets": hf_datasets,
        "stream_loader": stream_loader,
        "augment_recipes": augment_recipes,
        "image_sizes": image_sizes,
        "bench_ladder": bench_ladder,
        "cuda_tests": cuda_tests,
        "tier_fallback": lambda c: tier_fallback(c, tier_data),  # type: ignore[arg-type]
        "ddp_overhead": ddp_overhead,
        "accelerate_tiers": accelerate_tiers,
        "tune": tune,
        "diagnose_script": diagnose_script,
        "launches": launches,
    }
    unknown = [n for n in args.parts or [] if n not in parts]
    if unknown:
        p.error(f"unknown parts {unknown}; the parts are {list(parts)}")
    order = args.parts or list(parts)
    if c.small:  # these need a GPU by nature
        order = [n for n in order if n not in GPU_ONLY]
    signal.signal(signal.SIGALRM, _alarm)
    for name in order:
        left = args.budget - (time.perf_counter() - t_start)
        if left < 10 and not args.no_time_limits:
            c.summary[name] = {"skipped": f"out of the {args.budget:.0f} s budget"}
            continue
        limit = int(min(LIMITS[name], left))
        t = time.perf_counter()
        signal.alarm(0 if args.no_time_limits else limit)  # (0: no alarm)
        try:
            c.summary[name] = parts[name](c)
        except PartTimeout:
            partial = c.summary.get(name) if isinstance(c.summary.get(name), dict) else {}
            c.summary[name] = {**partial, "error": f"timed out after {limit} s"}
        except Exception:
            c.summary[name] = {**(c.summary.get(name) or {}), "error": traceback.format_exc()[-3000:]}
        finally:
            signal.alarm(0)
        c.summary[name]["part_seconds"] = round(time.perf_counter() - t, 1)
        print(f"[{name}] {time.perf_counter() - t:.1f}s: {json.dumps(c.summary[name], default=str)[:600]}", flush=True)
        c.save()
    if tier_data is not None:
        tier_data.path.unlink(missing_ok=True)
    c.summary["total_seconds"] = round(time.perf_counter() - t_start, 1)
    c.save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
