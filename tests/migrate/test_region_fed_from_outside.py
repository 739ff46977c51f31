"""A forward pass in the training loop, outside the region, whose result the loss reads.

Adversarial training computes the clean sample's scores once per batch (``clean = model(x)``,
``clean_prob = F.softmax(clean, dim=1)``) and then, in an inner loop of attack steps, a loss whose
KL term reads them. The region goes around the inner loop's forward pass and loss; the clean pass
before that loop stayed outside it. apex O1 ran it in float16; natively it ran in float32, and the
KL term changed. It now goes under an autocast of its own with the lines right after it that
compute from it, enabled as the region. A pass whose result no region reads is left as it was.
"""
from __future__ import annotations

import itertools

import pytest
from rewrite_runs import compare_with_its_rewrite

from migrate.api import migrate_source

pytestmark = pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")

SCRIPT = """import torch
import torch.nn.functional as F
from apex import amp

torch.manual_seed(0)
use_amp = True
adversarial = True
model = torch.nn.Linear(8, 3).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if use_amp:
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
batches = [torch.randn(4, 8).cuda() for _ in range(4)]
for step, x in enumerate(batches):
{clean}
    delta = torch.zeros_like(x)
{inner}
        delta.requires_grad_()
        scores = model(x + delta)
        loss = {loss}
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        delta = (delta + 0.1 * delta.grad.sign()).detach()
{advance}
    optimizer.step()
    optimizer.zero_grad()
    print("loss", step, round(loss.item(), 5))
"""
# how the clean pass is written
PASSES = {
    "detached": "clean = model(x).detach()",
    "forward": "clean = model.forward(x).detach()",
    "sliced": "clean = model(x)[:, :3].detach()",
    "tuple": "clean, width = model(x).detach(), x.size(1)",
}
# what the loss reads of it: the pass's result itself, or a line computing from it
READS = {
    "itself": ("", "(torch.sin(scores * 40.0) - torch.sin(clean * 40.0)).pow(2).mean() + scores.pow(2).mean()"),
    "reader": ("clean_prob = F.softmax(clean * 40.0, dim=1)",
               "F.kl_div(F.log_softmax(scores * 40.0, dim=1), clean_prob, reduction='batchmean') + scores.pow(2).mean()"),
}
# the inner loop of attack steps
INNERS = {
    "for": ("    for astep in range(2):", ""),
    "while": ("    astep = 0\n    while astep < 2:", "        astep += 1"),
}
GUARDS = ("plain", "guarded")


def _script(clean: str, reads: str, inner: str, guard: str) -> str:
    reader, loss = READS[reads]
    lines = [PASSES[clean], *([reader] if reader else [])]
    if guard == "guarded":
        lines = ["if adversarial:", *("    " + line for line in lines)]
    opening, advance = INNERS[inner]
    return SCRIPT.format(clean="\n".join("    " + line for line in lines), inner=opening, loss=loss, advance=advance)


CASES = list(itertools.product(sorted(PASSES), sorted(READS), sorted(INNERS), GUARDS))


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


@pytest.mark.parametrize(("clean", "reads", "inner", "guard"), CASES)
def test_the_pass_the_loss_reads_goes_under_autocast(clean, reads, inner, guard):
    source = _script(clean, reads, inner, guard)
    compile(source, "train.py", "exec")
    new = migrate_source(source, "train.py").new_source
    assert "from apex import" not in new and "TODO(ampmigrate)" not in new, new
    lines = new.splitlines()
    opening = [index for index, line in enumerate(lines) if line.strip().startswith("with torch.autocast(")]
    assert len(opening) == 2, new  # the clean pass's, then the inner loop's region
    at = next(index for index, line in enumerate(lines) if line.strip() == PASSES[clean])
    assert opening[0] < at and _indent(lines[at]) == _indent(lines[opening[0]]) + 4, new
    assert lines[opening[0]].strip() == lines[opening[1]].strip(), new  # enabled as the region
    if reads == "reader":
        reader = next(index for index, line in enumerate(lines) if line.strip() == READS["reader"][0])
        assert reader == at + 1 and _indent(lines[reader]) == _indent(lines[at]), new


@pytest.mark.parametrize("clean", sorted(PASSES))
def test_a_pass_no_region_reads_stays_as_it_was(clean):
    source = _script(clean, "itself", "for", "plain").replace(
        "(torch.sin(scores * 40.0) - torch.sin(clean * 40.0)).pow(2).mean() + ", "").replace(
        "    delta = torch.zeros_like(x)\n", "    print(float(clean.sum()))\n    delta = torch.zeros_like(x)\n")
    new = migrate_source(source, "train.py").new_source
    assert "from apex import" not in new and "TODO(ampmigrate)" not in new, new
    assert new.count("with torch.autocast(") == 1, new


@pytest.mark.slow
@pytest.mark.parametrize(("clean", "reads"), [("detached", "reader"), ("forward", "itself")])
def test_the_rewrite_trains_as_apex_did(tmp_path, clean, reads):
    """The original on ampshim and its rewrite train the same on the CPU; with the clean pass left
    in float32 (the rewrite before) the losses part."""
    from ampshim.compare import SAME
    from ampshim.compare.report import as_text

    original = tmp_path / "original"
    original.mkdir()
    (original / "train.py").write_text(_script(clean, reads, "for", "plain"))
    result = compare_with_its_rewrite(original)
    assert result.verdict == SAME, as_text(result)
