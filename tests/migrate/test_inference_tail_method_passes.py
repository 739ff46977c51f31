"""An O1 ``amp.initialize`` readying a model for inference, whose only passes after it are calls
of the model's own methods (``q = model.encode_q(ids, mask)``, ``model.module.embed(x)`` through
a wrapper), as retrieval and embedding scripts run them: apex cast those passes as it cast
``model(x)``, so the lines after the call go under autocast as for a ``model(x)`` pass. Before,
only a call of the model itself counted as running it, and the call was left for the unsafe
hand-off. Generated over the method's spelling, where the call stands (a function's end, the
script's ``if __name__ == "__main__":`` block, module level) and how the pass is wrapped; the
negatives call only methods that compute nothing (``eval()``, ``state_dict()``)."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

from generated.inference_runs import printed_alike

MODEL = """import argparse

import torch
from apex import amp


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.proj(x)

    def encode_q(self, x, mask=None):
        return self.proj(x) * 2

    def embed(self, x):
        return torch.relu(self.proj(x))


"""
# the method pass, `{net}` standing for the model's name there
PASSES = {
    "encode": "{net}.encode_q(batch, None)",
    "embed": "{net}.embed(batch)",
    "through .module": "{net}.module.embed(batch)",
}
# how the pass sits among the lines after the call
WRAPS = {
    "loop under no_grad": "outputs = []\nfor batch in batches:\n    with torch.no_grad():\n        outputs.append({pass_})\n",
    "no_grad around a loop": "outputs = []\nwith torch.no_grad():\n    for batch in batches:\n        outputs.append({pass_})\n",
    "one pass": "batch = batches[0]\noutputs = [{pass_}.detach()]\n",
}
PRINT = "print('out', [str(o.dtype) for o in outputs], [round(float(o.float().sum()), 2) for o in outputs])\n"
SETUP = ("torch.manual_seed(0)\nmodel = Encoder()\n{wrap_model}batches = [torch.randn(3, 8) for _ in range(2)]\n"
         "model = amp.initialize(model, opt_level=\"O1\")\nmodel.eval()\n")


def _indented(lines: str, depth: int) -> str:
    return "".join(" " * depth + line + "\n" if line else "\n" for line in lines.splitlines())


def _script(place: str, pass_: str, wrap: str) -> str:
    wrap_model = "model = torch.nn.DataParallel(model)\n" if pass_ == "through .module" else ""
    lines = SETUP.format(wrap_model=wrap_model) + WRAPS[wrap].format(pass_=PASSES[pass_].format(net="model")) + PRINT
    if place == "function":
        return MODEL + "def main():\n" + _indented(lines, 4) + '\n\nif __name__ == "__main__":\n    main()\n'
    if place == "main block":
        return MODEL + 'if __name__ == "__main__":\n' + _indented(lines, 4)
    return MODEL + lines


VARIANTS = [(place, pass_, wrap) for (place, pass_), wrap in zip(itertools.product(["function", "main block", "module"], PASSES),
                                                                 itertools.cycle(WRAPS))]


@pytest.mark.parametrize("place, pass_, wrap", VARIANTS)
def test_a_method_pass_after_an_inference_initialize_runs_under_autocast(place, pass_, wrap):
    source = _script(place, pass_, wrap)
    compile(source, "encode.py", "exec")
    result = migrate_source(source, "encode.py")
    new = result.new_source
    assert "apex" not in new and "amp.initialize" not in new, new
    assert all(d.fix is None or not d.fix.why_unsafe for d in result.diagnostics), new
    region = 'with torch.autocast("cuda", dtype=torch.float16):'
    assert region in new, new
    after = new.split(region)[1]
    assert PASSES[pass_].format(net="model") in after and "'out'" in after, new
    compile(new, "encode.py", "exec")


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("variant", [VARIANTS[0], pytest.param(VARIANTS[4], marks=pytest.mark.slow),
                                     pytest.param(VARIANTS[7], marks=pytest.mark.slow)])
def test_the_migrated_method_pass_infers_as_apex_did(tmp_path, variant):
    """The original on ampshim and its rewrite print the same outputs, in the same precision."""
    expected = printed_alike(tmp_path, _script(*variant), "encode.py", [])
    assert "bfloat16" in expected, expected


@pytest.mark.parametrize("method", ["eval()", "state_dict()", "cuda()", "parameters()"])
def test_methods_that_compute_nothing_are_no_pass(method):
    """Only ``model.eval()``-like calls after the call: the model runs nowhere in sight, so the call
    keeps its unsafe hand-off."""
    source = MODEL + "def main():\n" + _indented(SETUP.format(wrap_model="") + f"print('out', model.{method})\n", 4)
    new = migrate_source(source, "encode.py").new_source
    assert "torch.autocast(" not in new and "amp.initialize(" in new, new
