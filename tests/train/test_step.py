import pytest
import torch

from gpufeed.train.models import build_model
from gpufeed.train.step import SGD, make_step


def _pair(seed=0):
    torch.manual_seed(seed)
    a = build_model("small")
    b = build_model("small")
    b.load_state_dict(a.state_dict())
    return a, b


def test_sgd_matches_torch_nesterov_sgd_with_weight_decay():
    # The same gradients fed to both optimisers: a multi-threaded backward is not bit-reproducible,
    # and a few training steps amplify its rounding, so gradients come from a seeded generator instead.
    ours_model, ref_model = _pair()
    lr = torch.tensor(0.05)
    ours = SGD(list(ours_model.parameters()), lr, momentum=0.9, weight_decay=5e-4)
    ref = torch.optim.SGD(ref_model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=True)
    initial = [p.detach().clone() for p in ours_model.parameters()]
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        for p, q in zip(ours_model.parameters(), ref_model.parameters(), strict=True):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        ours.step()
        ref.step()
    for p, q, p0 in zip(ours_model.parameters(), ref_model.parameters(), initial, strict=True):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-7) and not torch.allclose(p, p0)


def test_eager_step_trains_the_model_and_returns_the_loss():
    model, ref = _pair()
    step = make_step(model, SGD(list(model.parameters()), torch.tensor(0.05), 0.9, 5e-4), None, torch.device("cpu"))
    x, y = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(2)), torch.arange(16) % 10
    loss = step(x, y)
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(ref(x), y), rtol=1e-5)
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters(), strict=True))


def test_learning_rate_tensor_changes_take_effect_without_rebuilding():
    model, _ = _pair()
    lr = torch.tensor(0.0)
    step = make_step(model, SGD(list(model.parameters()), lr, 0.9, 0.0), None, torch.device("cpu"))
    before = [p.clone() for p in model.parameters()]
    step(torch.randn(4, 3, 32, 32), torch.arange(4))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    lr.fill_(0.1)
    step(torch.randn(4, 3, 32, 32), torch.arange(4))
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graphed_step_follows_the_eager_trajectory():
    dev = torch.device("cuda")
    eager_model, graph_model = (m.to(dev) for m in _pair())
    lr_e, lr_g = torch.tensor(0.05, device=dev), torch.tensor(0.05, device=dev)
    g = torch.Generator().manual_seed(2)
    batches = [
        (torch.randn(32, 3, 32, 32, generator=g).to(dev), torch.randint(0, 10, (32,), generator=g).to(dev))
        for _ in range(4)
    ]
    eager = make_step(eager_model, SGD(list(eager_model.parameters()), lr_e, 0.9, 5e-4), None, dev)
    graphed = make_step(
        graph_model, SGD(list(graph_model.parameters()), lr_g, 0.9, 5e-4), None, dev, graph_example=batches[0]
    )
    for x, y in batches:
        le, lg = eager(x, y), graphed(x, y)
        assert torch.allclose(le, lg, rtol=1e-4, atol=1e-5)
    for p, q in zip(eager_model.parameters(), graph_model.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-5)
