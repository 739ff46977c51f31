"""apex's DistributedDataParallel where one forward pass takes several backward passes.

apex all-reduced after every backward pass; torch's DDP reduces once per forward pass, and with
``find_unused_parameters=True`` (which AMP010 gives it) raises at the second ("Trying to backward
through the graph a second time"). A domain-adaptation trainer does it: the wrapped net returns
every loss, the main loss's backward pass runs, then each discriminator loss's. Such a file is
reported and left as it was; a file with one backward pass per forward pass (arms of an ``if``,
accumulation, a GAN's ``detach()``, a forward pass per loss) is rewritten as before.
"""
from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap

import pytest

from migrate.api import migrate_source

HEADER = "import torch\nfrom apex.parallel import DistributedDataParallel as DDP\n\n\n"

# how the loop's forward pass returns what the backward passes read
FORWARDS = {
    "dict": ("losses = {model}(x)", 'losses["main"]', 'losses["aux"]'),
    "tuple": ("main, aux = {model}(x)", "main", "aux"),
    "derived": ("out = {model}(x)", "out.mean()", "(out ** 2).sum()"),
}
# how the two backward passes are written ({first}/{second}: what each reads)
BACKWARDS = {
    "plain": "loss = {first}\nloss.backward(retain_graph=True)\nother = {second}\nother.backward()",
    "scaled": ("with amp.scale_loss({first}, optimizer) as scaled_loss:\n    scaled_loss.backward()\n"
               "with amp.scale_loss({second}, optimizer) as scaled_loss:\n    scaled_loss.backward()"),
    "loop": "for part in ({first}, {second}):\n    part.backward(retain_graph=True)",
    "guarded_second": "{first}.backward(retain_graph=True)\nif step % 2 == 0:\n    {second}.backward()",
}
# where the wrapped model is, and where its forward pass runs
HOLDERS = {
    "same_function": ("def train(model, optimizer, loader):\n    model = DDP(model, delay_allreduce=True)\n"
                      "    for step, x in enumerate(loader):\n{body}", "model", 8),
    "handed_on": ("def setup(model):\n    model = DDP(model)\n    return model\n\n\n"
                  "def train(model, optimizer, loader):\n    for step, x in enumerate(loader):\n{body}", "model", 8),
    "returned": ("def wrap(net):\n    return DDP(net, delay_allreduce=True)\n\n\n"
                 "def train(model, optimizer, loader):\n    model = wrap(model)\n    for step, x in enumerate(loader):\n{body}",
                 "model", 8),
    "attribute": ("class Trainer:\n    def __init__(self, model):\n        self.net = DDP(model)\n\n"
                  "    def step(self, x, step, optimizer):\n{body}", "self.net", 8),
}


def _script(forward: str, backward: str, holder: str) -> str:
    template, model, indent = HOLDERS[holder]
    binding, first, second = FORWARDS[forward]
    lines = [binding.format(model=model), *BACKWARDS[backward].format(first=first, second=second).splitlines(),
             "optimizer.step()", "optimizer.zero_grad()"]
    body = textwrap.indent("\n".join(lines), " " * indent) + "\n"
    return HEADER.replace("\n\n\n", "\nfrom apex import amp\n\n\n") + template.format(body=body)


@pytest.mark.parametrize(("forward", "backward", "holder"), list(itertools.product(FORWARDS, BACKWARDS, HOLDERS)))
def test_two_backward_passes_through_one_forward_keep_apex_ddp_reported(forward, backward, holder):
    source = _script(forward, backward, holder)
    result = migrate_source(source, filename="train.py", select=["AMP010"])
    assert "apex.parallel" in result.new_source, result.new_source
    found = [d for d in result.diagnostics if d.code == "AMP010"]
    assert found and all("several backward passes" in d.message for d in found), found


ONE_PER_FORWARD = {
    # the usual switch: the scaled pass or the plain one
    "arms": ("out = model(x)\nloss = out.mean()\nif fp16:\n    with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
             "        scaled_loss.backward()\nelse:\n    loss.backward()"),
    "elif_arms": ("out = model(x)\nloss = out.mean()\nif fp16:\n    loss.backward()\nelif bf16:\n    (loss * 2).backward()\n"
                  "else:\n    loss.backward()"),
    # accumulation: a forward pass for each backward pass, in the same loop
    "micro_batches": "for part in x.chunk(4):\n    out = model(part)\n    out.mean().backward()",
    # a GAN: the discriminator's loss on a detached output, the generator's through it
    "gan": ("fake = model(x)\nd_loss = critic(fake.detach()).mean()\nd_loss.backward()\n"
            "g_loss = -critic(fake).mean()\ng_loss.backward()"),
    # a forward pass per loss
    "two_forwards": "out = model(x)\nout.mean().backward()\nout = model(x * 2)\nout.sum().backward()",
    # a forward pass whose output is only logged
    "logged": "with torch.no_grad():\n    probe = model(x)\n    seen = probe.mean()\nloss = critic(x).mean()\nloss.backward()",
}


@pytest.mark.parametrize("case", sorted(ONE_PER_FORWARD))
def test_one_backward_pass_per_forward_pass_is_rewritten(case):
    body = textwrap.indent(ONE_PER_FORWARD[case] + "\noptimizer.step()", " " * 8) + "\n"
    source = (HEADER.replace("\n\n\n", "\nfrom apex import amp\n\n\n")
              + "def train(model, critic, optimizer, loader, fp16, bf16):\n    model = DDP(model)\n"
              + "    for x in loader:\n" + body)
    result = migrate_source(source, filename="train.py", select=["AMP010"])
    assert "torch.nn.parallel.DistributedDataParallel(" in result.new_source, result.new_source
    assert "apex.parallel" not in result.new_source


_RUN = textwrap.dedent('''
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)

        def forward(self, x):
            features = self.body(x)
            return {"main": features.pow(2).mean(), "aux": self.head(features.detach()).mean()}

    model = torch.nn.parallel.DistributedDataParallel(Net(), find_unused_parameters=True, broadcast_buffers=False)
    losses = model(torch.randn(8, 4))
    losses["main"].backward()
    losses["aux"].backward()
    dist.destroy_process_group()
''')


@pytest.mark.slow
def test_torch_ddp_raises_at_a_second_backward_pass_through_one_forward_pass(tmp_path):
    """Why the rewrite is refused there, run: one rank on gloo is enough."""
    pytest.importorskip("torch")
    script = tmp_path / "run.py"
    script.write_text(_RUN)
    failed = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                             str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert failed.returncode != 0 and "second time" in failed.stdout + failed.stderr, failed.stderr[-2000:]
