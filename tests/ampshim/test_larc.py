import pickle

import pytest
import torch

from ampshim.parallel.LARC import LARC


def _one_param(values, grad):
    p = torch.nn.Parameter(torch.tensor(values))
    p.grad = torch.tensor(grad)
    return p


def test_clipped_step_by_hand():
    p = _one_param([3.0, 4.0], [0.0, 0.5])  # ||p|| = 5, ||g|| = 0.5
    optimizer = LARC(torch.optim.SGD([p], lr=0.5, weight_decay=0.1), trust_coefficient=0.02)
    optimizer.step()
    local_lr = 0.02 * 5 / (0.5 + 5 * 0.1 + 1e-8)  # 0.1, then clipped: min(0.1 / 0.5, 1) = 0.2
    grad = (torch.tensor([0.0, 0.5]) + 0.1 * torch.tensor([3.0, 4.0])) * min(local_lr / 0.5, 1)
    torch.testing.assert_close(p.detach(), torch.tensor([3.0, 4.0]) - 0.5 * grad)
    assert optimizer.param_groups[0]["weight_decay"] == 0.1  # restored after the inner step


def test_clip_never_raises_the_rate_above_lr():
    p = _one_param([3.0, 4.0], [0.0, 0.001])
    LARC(torch.optim.SGD([p], lr=0.5), trust_coefficient=0.02).step()  # local rate 100 -> clipped to 1
    torch.testing.assert_close(p.detach(), torch.tensor([3.0, 4.0 - 0.5 * 0.001]))


def test_scaling_mode_without_clip_by_hand():
    p = _one_param([3.0, 4.0], [0.0, 10.0])
    optimizer = LARC(torch.optim.SGD([p], lr=0.5), trust_coefficient=0.02, clip=False, eps=0.0)
    optimizer.step()
    local_lr = 0.02 * 5 / 10  # 0.01, used as a factor on the gradient; lr still applies
    torch.testing.assert_close(p.detach(), torch.tensor([3.0, 4.0 - 0.5 * 10 * local_lr]))


def test_zero_norms_leave_the_gradient_alone():
    p = _one_param([0.0, 0.0], [1.0, 1.0])
    LARC(torch.optim.SGD([p], lr=1.0)).step()
    torch.testing.assert_close(p.detach(), torch.tensor([-1.0, -1.0]))


def test_wrapper_forwards_the_optimizer_interface():
    p = _one_param([1.0], [1.0])
    inner = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    optimizer = LARC(inner)
    assert not isinstance(optimizer, torch.optim.Optimizer)
    assert optimizer.param_groups is inner.param_groups
    optimizer.step()
    assert optimizer.state is inner.state and "momentum_buffer" in optimizer.state[p]
    assert optimizer.state_dict()["param_groups"][0]["lr"] == 0.1
    optimizer.add_param_group({"params": [torch.nn.Parameter(torch.ones(1))]})
    assert len(inner.param_groups) == 2
    optimizer.zero_grad()
    assert p.grad is None
    assert repr(optimizer) == repr(inner)
    restored = pickle.loads(pickle.dumps(optimizer))
    assert restored.trust_coefficient == 0.02 and len(restored.param_groups) == 2


def test_inner_step_failure_still_restores_weight_decay():
    class Failing(torch.optim.SGD):
        def step(self, closure=None):
            raise RuntimeError("boom")

    p = _one_param([1.0], [1.0])
    optimizer = LARC(Failing([p], lr=0.1, weight_decay=0.3))
    with pytest.raises(RuntimeError, match="boom"):
        optimizer.step()
    assert optimizer.param_groups[0]["weight_decay"] == 0.3
