"""Shared statistics for distribution tests: chi-square and Kolmogorov-Smirnov, with stated significance."""

import math

import torch

DRAWS = 20_000
ALPHA = 1e-3  # significance of every distribution test below (fixed seeds: they cannot flake)


def chi_square_p_value(counts: torch.Tensor) -> float:
    """p-value of a chi-square goodness-of-fit test of ``counts`` against the uniform distribution."""
    counts = counts.double()
    expected = counts.sum() / counts.numel()
    stat = ((counts - expected) ** 2 / expected).sum()
    return float(1 - torch.distributions.Chi2(counts.numel() - 1).cdf(stat))


def ks_statistic(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sample Kolmogorov-Smirnov statistic (max distance between empirical CDFs)."""
    grid = torch.cat([a, b]).double().unique()
    cdf_a = torch.searchsorted(a.double().sort().values, grid, right=True) / a.numel()
    cdf_b = torch.searchsorted(b.double().sort().values, grid, right=True) / b.numel()
    return float((cdf_a - cdf_b).abs().max())


def ks_critical(n: int, m: int, alpha: float = ALPHA) -> float:
    return math.sqrt(-0.5 * math.log(alpha / 2)) * math.sqrt((n + m) / (n * m))


def gen(seed: int = 0, device: str | torch.device = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)
