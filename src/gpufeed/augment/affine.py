"""Per-sample affine resampling, as torchvision's tensor kernels compute it: the inverse matrix, its grid, its fill.

Shared by the auto-augment family (:mod:`.auto_ops`) and the per-image geometric ops (:mod:`.random_geometry`):
torchvision's ``_get_inverse_affine_matrix`` per sample (v1's and v2's order of arithmetic), and its
``_apply_grid_transform`` (``grid_sample`` with a ones channel sampled alongside for the fill) on a grid per sample.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as nnf

__all__ = ["affine_nearest", "affine_sample", "inverse_affine", "inverse_affine_v1", "inverse_affine_v2", "sample_grid"]


def inverse_affine(
    angle: torch.Tensor,
    tx: torch.Tensor,
    ty: torch.Tensor,
    scale: torch.Tensor,
    shear_x: torch.Tensor,
    shear_y: torch.Tensor,
    cx: torch.Tensor,
    cy: torch.Tensor,
) -> torch.Tensor:
    """``(N, 6)`` float64: torchvision's ``_get_inverse_affine_matrix`` per sample (degrees; the centre relative
    to the image centre), in Python's float arithmetic as torchvision computes it (cast, as it casts, to the
    image's float dtype, float32 for uint8, by :func:`affine_sample`): torch's own trigonometry
    differs from ``math``'s in the last bit, which moves a bilinear sample by a level now and then. Six
    numbers per sample, read to the host once per batch."""
    columns = [t.double().tolist() for t in (angle, tx, ty, scale, shear_x, shear_y, cx, cy)]
    rows = [inverse_affine_v1(*sample) for sample in zip(*columns, strict=True)]
    return torch.tensor(rows, dtype=torch.float64, device=angle.device).view(-1, 6)


def inverse_affine_v1(
    angle: float, tx: float, ty: float, scale: float, shear_x: float, shear_y: float, cx: float, cy: float
) -> list[float]:
    """torchvision v1's ``_get_inverse_affine_matrix`` for one sample, in Python's float arithmetic."""
    rot, sx, sy = math.radians(angle), math.radians(shear_x), math.radians(shear_y)
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [v / scale for v in (d, -b, 0.0, -c, a, 0.0)]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return m


def inverse_affine_v2(
    angle: float, tx: float, ty: float, scale: float, shear_x: float, shear_y: float, cx: float, cy: float
) -> list[float]:
    """torchvision v2's ``_get_inverse_affine_matrix`` (the same matrix as v1's, its arithmetic in another order:
    on PIL images, where the matrix is used in float64, the last bits move a bilinear sample now and then)."""
    rot, sx, sy = math.radians(angle), math.radians(shear_x), math.radians(shear_y)
    cos_sy, tan_sx, rot_minus_sy = math.cos(sy), math.tan(sx), rot - sy
    cx_plus_tx, cy_plus_ty = cx + tx, cy + ty
    a = math.cos(rot_minus_sy) / cos_sy
    b = -(a * tan_sx + math.sin(rot))
    c = math.sin(rot_minus_sy) / cos_sy
    d = math.cos(rot) - c * tan_sx
    m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
    m[2] += cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty
    m[5] += cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty
    return m


def affine_nearest(x: torch.Tensor, matrices: torch.Tensor, fill: tuple[float, ...] | None) -> torch.Tensor:
    """Each image resampled through its inverse affine matrix (nearest), as torchvision's tensor ``affine``."""
    return affine_sample(x, matrices, fill, "nearest")


def affine_sample(x: torch.Tensor, matrices: torch.Tensor, fill: tuple[float, ...] | None, mode: str) -> torch.Tensor:
    """Each image resampled through its inverse affine matrix (``"nearest"`` or ``"bilinear"``), as torchvision's
    tensor ``affine`` / ``rotate``: its sampling grid, its fill mask (a ones channel sampled alongside)."""
    n, c, h, w = x.shape
    work = x.dtype if x.dtype.is_floating_point else torch.float32  # torchvision's grid dtype
    theta = matrices.view(n, 2, 3).to(work)
    base, half = _base_grid(h, w, work, x.device)
    rescaled = theta.transpose(1, 2) / half
    grid = base.view(1, h * w, 3).expand(n, h * w, 3).bmm(rescaled).view(n, h, w, 2)
    return sample_grid(x, grid, fill, mode)


@functools.lru_cache(maxsize=32)
def _base_grid(h: int, w: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """torchvision's base grid for ``(h, w)`` images and the half sizes its matrices are divided by, made once per
    size (on a GPU, 8 kernel launches a batch otherwise); read them, never write to them."""
    base = torch.empty(1, h, w, 3, dtype=dtype, device=device)
    base[..., 0].copy_(torch.linspace(-w * 0.5 + 0.5, w * 0.5 + 0.5 - 1, steps=w, device=device))
    base[..., 1].copy_(torch.linspace(-h * 0.5 + 0.5, h * 0.5 + 0.5 - 1, steps=h, device=device).unsqueeze_(-1))
    base[..., 2].fill_(1)
    return base, torch.tensor([0.5 * w, 0.5 * h], dtype=dtype, device=device)


def sample_grid(x: torch.Tensor, grid: torch.Tensor, fill: tuple[float, ...] | None, mode: str) -> torch.Tensor:
    """torchvision's ``_apply_grid_transform`` for a grid per sample: ``grid_sample`` with a ones channel
    sampled alongside, whose value says where the fill goes."""
    n, c, h, w = x.shape
    dev = x.device
    img = x.to(torch.float32) if not x.dtype.is_floating_point else x
    if fill is not None:
        img = torch.cat((img, torch.ones((n, 1, h, w), dtype=img.dtype, device=dev)), dim=1)
    out = nnf.grid_sample(img, grid, mode=mode, padding_mode="zeros", align_corners=False)
    if fill is not None:
        mask = out[:, -1:].expand(n, c, h, w)
        out = out[:, :-1]
        values = torch.tensor(fill if len(fill) > 1 else fill * c, dtype=out.dtype, device=dev).view(1, c, 1, 1)
        if mode == "nearest":
            out = torch.where(mask < 0.5, values.expand_as(out), out)
        else:
            out = out * mask + (1.0 - mask) * values
    if x.dtype.is_floating_point:
        return out
    return out.round_().to(x.dtype)
