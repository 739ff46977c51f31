"""A loss another optimizer steps, after the scaled step, with a plain backward pass of its own (an
adversarial discriminator: ``dis_logits = disc(encoder(x))``, ``loss_dis.backward()``,
``optimizer_dis.step()``). apex O1 cast its forward pass too, process-wide; the safe rewrite left
it in float32 (the plain backward stays plain, as apex left it). The lines computing its loss
from a network's forward pass, or from what a region bound, now go under autocast of their own."""
from __future__ import annotations

import ast
import itertools

import pytest

from migrate.api import migrate_source

SCRIPT = '''\
import torch
import torch.nn.functional as F
from apex import amp


def train(model, disc, optimizer, optimizer_dis, batches):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in batches:
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        noise = torch.randn_like(x)
        features = {features}
        dis_logits = disc(features)
        loss_dis = F.binary_cross_entropy_with_logits(dis_logits, torch.ones_like(dis_logits))
        loss_dis.backward({retain})
        optimizer_dis.step()
        optimizer_dis.zero_grad()
{second}'''
FEATURES = {"model": "model(noise)", "submodule": "model[0](noise)", "detached": "model(noise).detach()",
            "sum": "model(noise) + model(x)"}
RETAIN = {"plain": "", "retained": "retain_graph=True"}
SECOND = {"none": "",
          "from_logits": "        loss_gen = F.binary_cross_entropy_with_logits(dis_logits, torch.zeros_like(dis_logits))\n"
                         "        loss_gen.backward()\n        optimizer_dis.zero_grad()\n"}


def _in_a_region(source: str, code: str) -> bool:
    wanted = ast.unparse(ast.parse(code))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.With) and any("autocast" in ast.unparse(item.context_expr) for item in node.items):
            if any(isinstance(inner, ast.stmt) and ast.unparse(inner) == wanted for inner in ast.walk(node)):
                return True
    return False


@pytest.mark.parametrize("features, retain, second", list(itertools.product(FEATURES, RETAIN, SECOND)))
def test_the_forward_pass_of_a_plain_loss_is_under_autocast(features, retain, second):
    source = SCRIPT.format(features=FEATURES[features], retain=RETAIN[retain], second=SECOND[second])
    result = migrate_source(source, filename="train.py")
    assert result.changed and "apex" not in result.new_source, [d.message for d in result.diagnostics]
    assert _in_a_region(result.new_source, "dis_logits = disc(features)"), result.new_source
    assert _in_a_region(result.new_source, f"features = {FEATURES[features]}"), result.new_source
    if second != "none":
        assert _in_a_region(result.new_source, "loss_gen = F.binary_cross_entropy_with_logits("
                                               "dis_logits, torch.zeros_like(dis_logits))"), result.new_source
    assert "loss_dis.backward(" in result.new_source and "scaler.scale(loss_dis)" not in result.new_source


MAIN = '''

if __name__ == "__main__":
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8)).cuda()
    critic = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).cuda()
    data = [(torch.randn(16, 8, device="cuda"), torch.randn(16, 8, device="cuda")) for _ in range(4)] * 5
    train(net, critic, torch.optim.SGD(net.parameters(), lr=0.05), torch.optim.SGD(critic.parameters(), lr=0.05), data)
'''


@pytest.mark.slow
@pytest.mark.parametrize("second", list(SECOND))
def test_a_plain_discriminator_pass_trains_as_apex_did(second, tmp_path):
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    source = SCRIPT.format(features=FEATURES["model"], retain=RETAIN["retained"], second=SECOND[second]) + MAIN
    (tmp_path / "original.py").write_text(source)
    (tmp_path / "rewritten.py").write_text(migrate_source(source, filename="train.py").new_source)
    comparison = compare(Target(str(tmp_path / "original.py")), Target(str(tmp_path / "rewritten.py")), [],
                         device="cpu", steps=15, parallel=True, timeout=240)
    assert comparison.verdict == SAME, as_text(comparison)
