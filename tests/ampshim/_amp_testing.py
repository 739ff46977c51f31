"""Shared by the amp core tests: a clean global amp state per test, and small models."""
import warnings

import pytest
import torch

from ampshim.state import _amp_state

# The deprecation notice every initialize() emits, and the one-time "bfloat16 on the CPU" notice.
quiet = pytest.mark.filterwarnings("ignore::ampshim.deprecation.DeprecatedFeatureWarning",
                                   "ignore:ampshim. the model")


@pytest.fixture(autouse=True)
def fresh_amp_state():
    saved = dict(vars(_amp_state))
    with warnings.catch_warnings():
        yield
    if _amp_state.handle is not None and _amp_state.handle.is_active():
        _amp_state.handle._deactivate()
    vars(_amp_state).clear()
    vars(_amp_state).update(saved)
    assert not torch.is_autocast_enabled("cpu")
    assert not (torch.cuda.is_available() and torch.is_autocast_enabled("cuda"))


def mlp(batchnorm=True):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 8)]
    if batchnorm:
        layers.append(torch.nn.BatchNorm1d(8))
    layers += [torch.nn.ReLU(), torch.nn.Linear(8, 2)]
    return torch.nn.Sequential(*layers)


def exact_linear(out_features=3, in_features=2):
    """A bias-free Linear whose gradients are small integers (exact in any float format)."""
    model = torch.nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.arange(out_features * in_features, dtype=torch.float32)
                           .reshape(out_features, in_features))
    return model


def int_batch(value, rows=2, columns=2):
    return torch.full((rows, columns), float(value))
