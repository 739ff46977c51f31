"""A forward pass above an ``if`` whose arm runs another initialized model and scales the loss.

``feat = backbone(x)``, then ``if use_head: loss = head(feat)`` and its scaled backward pass: the
arm's region starts at ``head(feat)``, and apex cast ``backbone(x)`` too (O1 casts every forward
pass once ``initialize`` ran). The forward pass above the ``if`` whose output the arm reads gets a
region of its own; left in float32 it trains differently (``ampshim compare``: "forward left in
float32").
"""
from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap

import pytest

from migrate.api import migrate_source

FORWARDS = {
    "plain": "feat = backbone(x)",
    "wrapped": "feat = torch.tanh(backbone(x))",
    "two_lines": "hidden = backbone(x)\nfeat = hidden * 2",
}
TESTS = ["use_head", "step % 2 == 0", "not frozen"]
NESTING = ["one", "two"]


def _script(forward: str, test: str, nesting: str) -> str:
    arm = ("loss = ((head(feat) - y) ** 2).mean()\noptimizer.zero_grad()\n"
           "with amp.scale_loss(loss, optimizer) as scaled_loss:\n    scaled_loss.backward()\noptimizer.step()")
    inner = f"if {test}:\n" + textwrap.indent(arm, "    ")
    if nesting == "two":
        inner = "if step >= 0:\n" + textwrap.indent(inner, "    ")
    body = FORWARDS[forward] + "\n" + inner
    return textwrap.dedent('''\
        import torch
        from apex import amp


        def main():
            torch.manual_seed(0)
            backbone = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32)).cuda()
            head = torch.nn.Linear(32, 1).cuda()
            optimizer = torch.optim.SGD(list(backbone.parameters()) + list(head.parameters()), lr=0.1)
            [backbone, head], optimizer = amp.initialize([backbone, head], optimizer, opt_level="O1")
            use_head, frozen = True, False
            for step in range(12):
                x = torch.randn(8, 16).cuda()
                y = torch.randn(8, 1).cuda()
        ''') + textwrap.indent(body, " " * 8) + '\n\n\nif __name__ == "__main__":\n    main()\n'


@pytest.mark.parametrize(("forward", "test", "nesting"), list(itertools.product(FORWARDS, TESTS, NESTING)))
def test_the_forward_pass_above_the_arm_goes_under_autocast(forward, test, nesting):
    new = migrate_source(_script(forward, test, nesting), "train.py").new_source
    assert "amp.scale_loss" not in new, new
    first = FORWARDS[forward].splitlines()[0]
    assert f'with torch.autocast("cuda", dtype=torch.float16):\n            {first}\n' in new, new
    assert 'with torch.autocast("cuda", dtype=torch.float16):\n' + " " * (16 if nesting == "one" else 20) + "loss = " in new, new


@pytest.mark.slow
@pytest.mark.parametrize(("forward", "nesting"), [("wrapped", "one"), ("two_lines", "two")])
def test_the_rewrite_trains_the_same(tmp_path, forward, nesting):
    original = tmp_path / "original.py"
    original.write_text(_script(forward, "use_head", nesting))
    migrated = tmp_path / "migrated.py"
    migrated.write_text(migrate_source(original.read_text(), "train.py").new_source)
    ran = subprocess.run([sys.executable, "-m", "ampshim", "compare", "--device", "cpu", "--steps", "12",
                          str(original), str(migrated)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
