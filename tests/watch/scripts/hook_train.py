"""A small training loop as people write it, run under the hook by tests/watch/test_hook.py (and without it)."""

import argparse
import hashlib
import signal
import sys
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Scale:
    """A transform with a repr, as torchvision's have."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor

    def __repr__(self) -> str:
        return f"Compose(\n    Scale(factor={self.factor})\n)"


class Points(Dataset):
    def __init__(self, n: int, transform=None, busy: float = 0.0) -> None:
        self.x = torch.linspace(-1, 1, n).unsqueeze(1)
        self.y = 3 * self.x + 0.5
        self.transform = transform
        self.busy = busy

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        # CPU work in the worker, on purpose, counted in this thread's CPU time: the same work however busy the
        # machine is (a wall-clock spin did less of it under load, and the workers' share of the CPU fell with it)
        end = time.thread_time() + self.busy
        while time.thread_time() < end:
            pass
        x = self.x[i] + 0.01 * torch.randn(1)  # randomness in __getitem__: the workers' seeds must not change
        return (self.transform(x) if self.transform else x), self.y[i]


class ShardLoader(DataLoader):
    """Like Accelerate's DataLoaderShard: its __iter__ goes through DataLoader.__iter__."""

    def __iter__(self):
        yield from super().__iter__()


class OwnLoader(DataLoader):
    """A script's own loader class: its __init__ has its own arguments and calls DataLoader's."""

    def __init__(self, data, batch_size, shuffle, num_workers, persistent_workers=False):
        super().__init__(
            data, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers, persistent_workers=persistent_workers
        )


def _loader_class(kind: str):
    if kind == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader
    return {"plain": DataLoader, "subclass": ShardLoader, "own-init": OwnLoader}[kind]


def _graceful_sigterm() -> list[bool]:
    """Lightning's own way (its handler composition): a SIGTERM sets a flag and calls the handler it found before
    it; the loop then ends by itself."""
    from lightning.pytorch.trainer.connectors.signal_connector import _HandlersCompose

    asked: list[bool] = []
    previous = signal.getsignal(signal.SIGTERM)  # as Lightning composes: its own handlers, then the one it found
    signal.signal(signal.SIGTERM, _HandlersCompose([lambda signum, frame: asked.append(True), previous]))
    return asked


def _chained_sigterm() -> None:
    """A handler of the script's own that logs, then hands the signal to the one before it (which ends it)."""
    previous = signal.getsignal(signal.SIGTERM)

    def handle(signum, frame):
        print("SIGTERM: handing over", flush=True)
        if callable(previous):
            previous(signum, frame)
        else:
            sys.exit(143)

    signal.signal(signal.SIGTERM, handle)


def _two_threads(loader, epochs: int) -> None:
    """Two iterators of one loader at the same time, each in its thread (a prefetching thread does this)."""
    seen = []

    def run():
        seen.append(sum(len(x) for x, _ in loader))

    for _ in range(epochs):
        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    print("samples seen", sum(seen), flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--crash-at", type=int, default=-1)
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--forever", action="store_true")
    p.add_argument("--busy", type=float, default=0.0)
    p.add_argument("--kind", choices=["plain", "subclass", "own-init", "stateful"], default="plain")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--graceful-sigterm", action="store_true")
    p.add_argument("--chained-sigterm", action="store_true")
    p.add_argument("--threads", action="store_true")
    p.add_argument("--n", type=int, default=64)
    a = p.parse_args()
    torch.manual_seed(0)
    ds = Points(a.n, transform=Scale(2.0), busy=a.busy)
    cls = _loader_class(a.kind)
    extra = {"persistent_workers": True} if a.persistent else {}
    loader = cls(
        ds,
        batch_size=8,
        shuffle=True,
        num_workers=a.workers,
        **extra,
    )
    if a.threads:
        _two_threads(loader, a.epochs)
        return 0
    asked = _graceful_sigterm() if a.graceful_sigterm else []
    if a.chained_sigterm:
        _chained_sigterm()
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    digest, step = hashlib.sha256(), 0
    epoch = 0
    while epoch < a.epochs or a.forever:
        for x, y in loader:
            if step == a.crash_at:
                raise RuntimeError(f"boom at step {step}")
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            digest.update(x.numpy().tobytes())
            print(f"step {step} loss {loss.item():.6f}", flush=True)
            step += 1
            if a.forever:
                time.sleep(0.02)
            if asked:
                break
        epoch += 1
        if asked:
            print("ended gracefully after SIGTERM", flush=True)
            return 0
    print("batches", digest.hexdigest()[:16], "rand", torch.rand(3).tolist(), flush=True)
    return a.exit_code


if __name__ == "__main__":
    sys.exit(main())
