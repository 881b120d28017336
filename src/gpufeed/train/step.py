"""One training step: eager, or captured once in a CUDA graph and replayed.

NOTE [ Graph capture ]
A captured step needs static shapes (every batch the same size: ``drop_last``), static memory (a
static input buffer the loader's batch is copied into, gradients zeroed in place, never set to
None) and no host synchronisation (no GradScaler, so fp16 is refused; bf16 needs no scaling). The
learning rate lives in a device tensor the schedule fills between replays. torch requires the
warm-up before capture to run on a side stream, so this module creates one stream for that (the
only stream gpufeed creates outside :mod:`gpufeed.loading.prefetch`). Warm-up steps would train on the first
batch; the parameters, buffers and momenta are restored afterwards, so the graphed run follows the
same trajectory as the eager one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["SGD", "make_step"]

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class SGD(torch.optim.Optimizer):
    """Nesterov SGD with weight decay, its learning rate held in a tensor (so a captured graph sees changes)."""

    def __init__(self, params: list[nn.Parameter], lr: torch.Tensor, momentum: float, weight_decay: float) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p)

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            grads = [p.grad for p in params]
            bufs = [self.state[p]["momentum_buffer"] for p in params]
            torch._foreach_add_(grads, params, alpha=group["weight_decay"])
            torch._foreach_mul_(bufs, group["momentum"])
            torch._foreach_add_(bufs, grads)
            update = torch._foreach_add(grads, bufs, alpha=group["momentum"])  # Nesterov: g + m * buf
            torch._foreach_mul_(update, group["lr"])
            torch._foreach_sub_(params, update)


def make_step(
    model: nn.Module,
    opt: SGD,
    amp: torch.dtype | None,
    device: torch.device,
    graph_example: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Step:
    """A function ``step(x, y) -> loss`` (a device scalar); captured in a CUDA graph if an example is given."""
    scaler = torch.amp.GradScaler(device.type) if amp == torch.float16 else None

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)  # in a capture, backward then writes fresh gradients each replay
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            loss = nn.functional.cross_entropy(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:  # fp16: dynamic loss scaling, eager only (see NOTE [ Graph capture ])
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss.detach()

    if graph_example is None:
        return step
    return _capture(step, model, opt, graph_example, device)


def _capture(
    step: Step, model: nn.Module, opt: SGD, example: tuple[torch.Tensor, torch.Tensor], device: torch.device
) -> Step:
    static_x, static_y = example[0].clone(memory_format=torch.preserve_format), example[1].clone()
    saved = [t.detach().clone() for t in _state_tensors(model, opt)]
    side = torch.cuda.Stream(device)  # NOTE [ Graph capture ]: warm-up on a side stream
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            step(static_x, static_y)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: a DataLoader pin-memory thread elsewhere in the process must not void the capture.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        static_loss = step(static_x, static_y)
    with torch.no_grad():
        for t, s in zip(_state_tensors(model, opt), saved, strict=True):
            t.copy_(s)

    def replay(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        return static_loss

    return replay


def _state_tensors(model: nn.Module, opt: SGD) -> list[torch.Tensor]:
    return [*model.parameters(), *model.buffers(), *(s["momentum_buffer"] for s in opt.state.values())]
