"""Kernel-launching operators per batch on the GPU's code path, counted on any machine.

Each recipe runs on a CPU batch inside ``gpufeed.augment.paths.device_path()``, so it takes the code path a CUDA
batch takes (whole-batch masks, the batched resampler, one gather; tests/augment/test_paths.py checks that path's
pixels), under a ``TorchDispatchMode`` that counts the ATen operators dispatched. On a GPU each one that is not a
view, an allocation or a metadata query launches at least one kernel: the count is a lower bound on the launches
(a CUDA graph would replay them as one), and ``host_reads`` counts the scalar reads that would synchronise the
stream (``int(t)``, ``bool(t)``, ``t.item()``; a ``t.tolist()`` is not seen on the CPU). The GPU's own counts are
taken by benchmarks/gpu_check.py.

    python benchmarks/launches.py [--size 32] [--batch 256] [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch
import torch._inductor.metrics
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))
from gpufeed import augment as A
from gpufeed.augment import fusion
from gpufeed.augment.paths import device_path

from harness import environment, save_json

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
# dispatched without a kernel: allocations, metadata, and the scalar read (counted apart as a host read)
_FREE = {"empty", "empty_like", "empty_strided", "size", "stride", "sym_size", "sym_stride", "lift_fresh", "detach"}
_FREE |= {"is_same_size", "_local_scalar_dense", "resolve_conj", "resolve_neg", "set_"}


class Launches(TorchDispatchMode):
    """Counts the operators that launch a kernel on a GPU, by name, and the host reads."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.host_reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        if name == "_local_scalar_dense":
            self.host_reads += 1
        elif not func.is_view and name not in _FREE:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def count(transform: Callable[..., torch.Tensor], x: torch.Tensor, seed: int = 0) -> Launches:
    """One call of ``transform`` on ``x`` (seeded) on the device's code path, counted (after one uncounted call,
    which makes the constants a loader keeps, and compiles the fused ops).

    A fused op (gpufeed.augment.fusion) runs compiled code that the dispatcher does not see: each of its calls is
    counted as the kernels Inductor generated for it when it compiled (``fused:<name>``; the CPU's C++ kernels,
    which a GPU's Triton kernels follow loop for loop), and it runs outside the counting mode (under one, dynamo
    would trace the eager ops instead)."""
    kernels: dict[int, int] = {}
    call = fusion._Fused.__call__

    def compiling_call(self, *args):  # type: ignore[no-untyped-def]
        before = torch._inductor.metrics.generated_kernel_count
        out = call(self, *args)
        kernels[id(self)] = kernels.get(id(self), 0) + torch._inductor.metrics.generated_kernel_count - before
        return out

    def counted_call(self, *args):  # type: ignore[no-untyped-def]
        mode = torch.utils._python_dispatch._get_current_dispatch_mode()
        with torch.utils._python_dispatch._disable_current_modes():
            out = call(self, *args)
        if isinstance(mode, Launches):
            mode.ops[f"fused:{self.fn.__name__}"] += kernels.get(id(self), 0)
        return out

    torch._dynamo.reset()  # dynamo's compiled frames are kept per code object: compile anew, counting its kernels
    with mock.patch.object(fusion._Fused, "__call__", compiling_call), device_path(), fusion.foreground():
        transform(x, generator=torch.Generator().manual_seed(seed))  # compiled here, not in the background
    with mock.patch.object(fusion._Fused, "__call__", counted_call), device_path(), Launches() as counter:
        transform(x, generator=torch.Generator().manual_seed(seed + 1))
    return counter


def recipes(size: int) -> dict[str, A.Compose]:
    crop = [A.RandomCrop(size, padding=size // 8), A.RandomHorizontalFlip()]
    norm = A.Normalize(MEAN, STD)
    return {
        "crop+flip+normalise": A.Compose([*crop, norm]),
        "RandomResizedCrop+flip+normalise": A.Compose([A.RandomResizedCrop(size), A.RandomHorizontalFlip(), norm]),
        "ColorJitter(0.4,0.4,0.4,0.1)+crop+flip+normalise": A.Compose([A.ColorJitter(0.4, 0.4, 0.4, 0.1), *crop, norm]),
        "crop+flip+TrivialAugmentWide+normalise": A.Compose([*crop, A.TrivialAugmentWide(), norm]),
        "crop+flip+RandAugment(2,9)+normalise": A.Compose([*crop, A.RandAugment(2, 9), norm]),
    }


# The goals per recipe (issue 31): at most this many launching operators per batch.
GOALS = {"crop+flip+normalise": 12}
GOALS |= {"ColorJitter(0.4,0.4,0.4,0.1)+crop+flip+normalise": 40}
GOALS |= {"crop+flip+TrivialAugmentWide+normalise": 80, "crop+flip+RandAugment(2,9)+normalise": 80}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args(argv)
    # the fused ops' kernels are counted as Inductor generates them: from the graph, not from its on-disk cache
    torch._inductor.config.fx_graph_cache = False
    x = torch.randint(0, 256, (args.batch, 3, args.size, args.size), dtype=torch.uint8)
    rows = []
    for name, recipe in recipes(args.size).items():
        c = count(recipe, x)
        top = ", ".join(f"{op} {k}" for op, k in c.ops.most_common(6))
        rows.append({"name": name, "launches": c.total, "host_reads": c.host_reads, "goal": GOALS.get(name),
                     "top_ops": dict(c.ops.most_common())})  # fmt: skip
        print(f"{name}: {c.total} launching ops, {c.host_reads} host reads (goal <= {GOALS.get(name)}); {top}")
    env = environment(torch.device("cpu"), size=args.size, batch_size=args.batch, path="device (counted on the CPU)")
    save_json(args.out / "launches.json", env, [], None, recipes=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
