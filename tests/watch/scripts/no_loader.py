"""A training loop that slices its tensors itself: no ``DataLoader`` anywhere.

Usage: python no_loader.py

Prints ``step K loss L`` per batch and ``batches seen N`` at the end.
"""

from __future__ import annotations

import torch


def main() -> None:
    torch.manual_seed(0)
    features, labels = torch.randn(128, 16), torch.randint(0, 2, (128,))
    model = torch.nn.Linear(16, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = 0
    for _ in range(2):
        order = torch.randperm(len(features))
        for start in range(0, len(order), 32):
            idx = order[start : start + 32]
            loss = torch.nn.functional.cross_entropy(model(features[idx]), labels[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"step {seen} loss {loss.item():.6f}", flush=True)
            seen += 1
    print(f"batches seen {seen}", flush=True)


if __name__ == "__main__":
    main()
