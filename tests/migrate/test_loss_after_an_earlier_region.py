"""A loss computed after another step from what an earlier region made: a GAN's generator loss.

A pix2pix-style trainer runs the generator and the discriminator, steps the discriminator, then
computes the generator's loss from ``output`` and ``d_fake`` with its own loss networks (a VGG
loss made as ``VGGLoss(device)``, an adversarial loss object) and weights from ``args``. That loss
has no forward pass beside its ``amp.scale_loss``, and the rewrite marked the file unsafe, leaving
it on apex in a safe run. An autocast around those lines casts what apex cast: their values come
from the earlier region, data moved or looped over, objects made by a class, options and imports.
Where a value comes from a forward pass outside every region, the file stays unsafe.
"""
from __future__ import annotations

import itertools
import textwrap

import pytest
from rewrite_runs import compare_with_its_rewrite

from migrate.api import migrate_source

pytestmark = pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")

SCRIPT = """import argparse
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from apex import amp

parser = argparse.ArgumentParser()
parser.add_argument("--weight", type=float, default=2.0)
args = parser.parse_args()
torch.manual_seed(0)


class Adversarial:
    def forward_G(self, fake):
        return (fake - 1).pow(2).mean()


generator = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh()).cuda()
critic = torch.nn.Linear(8, 1).cuda()
perceptual = torch.nn.Linear(8, 3).cuda()  # the loss's own float32 network, never initialized
adversarial = Adversarial()
opt_g = torch.optim.SGD(generator.parameters(), lr=0.1)
opt_d = torch.optim.SGD(critic.parameters(), lr=0.1)
[generator, critic], [opt_g, opt_d] = amp.initialize([generator, critic], [opt_g, opt_d], opt_level="O1",
                                                     num_losses=2, verbosity=0)
loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 8)), batch_size=4)
{before}for epoch in range(2):
    {loop}
{data}        output = generator(z)
        d_fake = critic(output.detach())
        loss_d = (d_fake.pow(2).mean() + critic(target).sub(1).pow(2).mean()) / 2
        opt_d.zero_grad()
        with amp.scale_loss(loss_d, opt_d, loss_id=0) as scaled:
            scaled.backward()
        opt_d.step()
{g_loss}
        opt_g.zero_grad()
        with amp.scale_loss(loss_g, opt_g, loss_id=1) as scaled:
            scaled.backward()
        opt_g.step()
        print("loss", epoch, round(loss_g.item(), 4))
"""
# the generator's loss, from the earlier region's `output` and `d_fake`
G_LOSSES = {
    "loss_network": "loss_g = F.mse_loss(perceptual(output), perceptual(target))",
    "method": "loss_g = adversarial.forward_G(perceptual(output).mean(1, keepdim=True))",
    "weighted": ("loss_l1 = F.l1_loss(output, target)\n"
                 "loss_adv = adversarial.forward_G(d_fake.detach()) + perceptual(output).pow(2).mean()\n"
                 "loss_g = args.weight * loss_l1 + loss_adv"),
}
DATA = {"as_loaded": "", "moved": "z, target = z.cuda(), target.cuda()", "moved_each": "z = z.cuda()\ntarget = target.to('cuda')"}
LOOPS = {"plain": "for z, target in loader:", "enumerate": "for step, (z, target) in enumerate(loader):"}


def _indented(lines: str) -> str:
    return "".join(f"        {line}\n" for line in lines.splitlines())


def _script(g_loss: str, data: str, loop: str, before: str = "", g_text: str | None = None) -> str:
    return SCRIPT.format(before=before, loop=LOOPS[loop], data=_indented(DATA[data]),
                         g_loss=_indented(g_text or G_LOSSES[g_loss]).rstrip("\n"))


CASES = list(itertools.product(sorted(G_LOSSES), sorted(DATA), sorted(LOOPS)))


@pytest.mark.parametrize(("g_loss", "data", "loop"), CASES)
def test_the_generator_loss_gets_its_own_region(g_loss, data, loop):
    source = _script(g_loss, data, loop)
    compile(source, "train.py", "exec")
    new = migrate_source(source, "train.py").new_source
    assert "from apex import" not in new and "TODO(ampmigrate)" not in new, new
    lines = new.splitlines()
    at = next(index for index, line in enumerate(lines) if line.strip().startswith("loss_g = "))
    opening = max(index for index, line in enumerate(lines[:at]) if "with torch.autocast(" in line)
    assert not any(".step(opt_d)" in line for line in lines[opening:at]), new  # a region of its own, after the step


# a value from a forward pass outside every region: apex cast it, an autocast around the loss does not
OUTSIDE = {
    "before_the_loop": ("anchor = generator(torch.zeros(1, 4).cuda()).detach()\n",
                        "loss_g = F.mse_loss(output, target) + (output - anchor).pow(2).mean()"),
    "a_helper": ("def anchor_of(net):\n    return net(torch.zeros(1, 4).cuda()).detach()\n\n\nanchor = anchor_of(generator)\n",
                 "loss_g = F.mse_loss(output, target) + (output - anchor).pow(2).mean()"),
}


@pytest.mark.parametrize("outside", sorted(OUTSIDE))
def test_a_value_from_outside_every_region_keeps_it_unsafe(outside):
    before, g_text = OUTSIDE[outside]
    source = _script("", "moved", "enumerate", before=before, g_text=g_text)
    new = migrate_source(source, "train.py").new_source
    assert new == source


@pytest.mark.parametrize("handed", ["parameter", "global"])
def test_a_value_handed_to_the_training_function_keeps_it_unsafe(handed):
    """``def train(anchor)``: what made the parameter (or a global read there) is not seen from the loop."""
    source = _script("", "moved", "enumerate", g_text="loss_g = F.mse_loss(output, target) + (output - anchor).pow(2).mean()")
    head, loop = source.split("for epoch in range(2):\n")
    signature = "def train(anchor):\n" if handed == "parameter" else "def train():\n"
    call = "train(generator(torch.zeros(1, 4).cuda()).detach())\n" if handed == "parameter" else "train()\n"
    made = "" if handed == "parameter" else "anchor = generator(torch.zeros(1, 4).cuda()).detach()\n"
    body = textwrap.indent("for epoch in range(2):\n" + loop, "    ")
    source = f"{head}{made}{signature}{body}\n\n{call}"
    compile(source, "train.py", "exec")
    assert migrate_source(source, "train.py").new_source == source


@pytest.mark.slow
@pytest.mark.parametrize(("g_loss", "data", "loop"), [("weighted", "moved", "enumerate"), ("loss_network", "as_loaded", "plain")])
def test_the_rewrite_trains_as_apex_did(tmp_path, g_loss, data, loop):
    """On the CPU, float16 as bfloat16: the original on ampshim and its safe rewrite train the same."""
    from ampshim.compare import SAME
    from ampshim.compare.report import as_text

    original = tmp_path / "original"
    original.mkdir()
    (original / "train.py").write_text(_script(g_loss, data, loop))
    result = compare_with_its_rewrite(original, steps=4)
    assert result.verdict == SAME, as_text(result)
