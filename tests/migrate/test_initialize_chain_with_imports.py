"""A chain of ``amp.initialize`` arms under the mixed-precision flag, each arm importing apex first.

A virtual try-on trainer (sangyun884/HR-VITON) initializes under ``if opt.fp16:``, in two arms of
``if not opt.GT:`` that differ only in the models (a warping network in one): each arm holds
``from apex import amp`` and then ``amp.initialize(..., num_losses=2)``. Whichever arm runs, apex
made the same per-loss scalers, so the chain is one setup: the scalers are made before the flag's
``if``, enabled by its test, and the chain goes with its imports. It was refused ("in arms that
exclude each other"): the imports made the arms hold more than ``initialize``. With per-loss
scalers, the several calls also merged the losses into one scaler, unsafely.
"""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

pytestmark = pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")

SCRIPT = """import argparse
import torch
{top_import}
parser = argparse.ArgumentParser()
parser.add_argument("--fp16", action="store_true")
parser.add_argument("--gt", action="store_true")
opt = parser.parse_args()


def train():
    torch.manual_seed(0)
    warper = torch.nn.Linear(4, 4).cuda()
    generator = torch.nn.Linear(4, 4).cuda()
    critic = torch.nn.Linear(4, 1).cuda()
    opt_g = torch.optim.SGD(generator.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(critic.parameters(), lr=0.1)
    if opt.fp16:
{chain}
    for step in range(5):
        x = torch.randn(8, 4).cuda()
        with torch.no_grad():
            warped = warper(x) if not opt.gt else x
        fake = generator(warped)
        loss_g = -critic(fake).mean()
        opt_g.zero_grad()
        if opt.fp16:
            with amp.scale_loss(loss_g, opt_g{id_g}) as scaled:
                scaled.backward()
        else:
            loss_g.backward()
        opt_g.step()
        loss_d = critic(fake.detach()).mean() - critic(x).mean()
        opt_d.zero_grad()
        if opt.fp16:
            with amp.scale_loss(loss_d, opt_d{id_d}) as scaled:
                scaled.backward()
        else:
            loss_d.backward()
        opt_d.step()
        print("step", step, loss_g.item(), loss_d.item())


train()
"""
WITH_WARPER = "[warper, generator, critic], [opt_g, opt_d] = amp.initialize([warper, generator, critic], [opt_g, opt_d], opt_level='O1'{losses})"
WITHOUT = "[generator, critic], [opt_g, opt_d] = amp.initialize([generator, critic], [opt_g, opt_d], opt_level='O1'{losses})"
IMPORTS = {"top": None, "from_apex": "from apex import amp", "import_as": "import apex.amp as amp"}
TESTS = {"negated": ("if not opt.gt:", WITH_WARPER, WITHOUT), "plain": ("if opt.gt:", WITHOUT, WITH_WARPER)}
LOSSES = {"one_scaler": ("", "", ""), "per_loss": (", num_losses=2", ", loss_id=0", ", loss_id=1")}
CASES = list(itertools.product(sorted(IMPORTS), sorted(TESTS), sorted(LOSSES)))


def _script(imports: str, test: str, losses: str) -> str:
    imported = IMPORTS[imports]
    head, first, second = TESTS[test]
    options, id_g, id_d = LOSSES[losses]
    arm = "".join(f"            {line}\n" for line in ([imported] if imported else []))
    chain = (f"        {head}\n{arm}            {first.format(losses=options)}\n"
             f"        else:\n{arm}            {second.format(losses=options)}")
    return SCRIPT.format(top_import="from apex import amp\n" if imported is None else "", chain=chain, id_g=id_g, id_d=id_d)


@pytest.mark.parametrize(("imports", "test", "losses"), CASES)
def test_the_chain_goes_with_its_imports(imports, test, losses):
    source = _script(imports, test, losses)
    compile(source, "train.py", "exec")
    new = migrate_source(source, "train.py").new_source
    assert "apex" not in new and "TODO(ampmigrate)" not in new, new
    scalers = ["scaler_0", "scaler_1"] if losses == "per_loss" else ["scaler"]
    for scaler in scalers:
        assert f'{scaler} = torch.amp.GradScaler("cuda", enabled=opt.fp16)' in new, new
    assert migrate_source(new, "train.py").new_source == new  # idempotent


@pytest.mark.parametrize("imports", sorted(IMPORTS))
def test_an_unsafe_chain_carries_its_marker_above_the_scaler(imports):
    """Both losses stepping one optimizer merge apex's per-loss scalers into one, unsafely: the
    marker goes above the scaler made before the flag's ``if`` (it was refused: "two rewrites
    would overlap", the marker placed on the removed chain)."""
    source = _script(imports, "negated", "per_loss").replace("scale_loss(loss_d, opt_d", "scale_loss(loss_d, opt_g")
    new = migrate_source(source, "train.py", unsafe_fixes=True).new_source
    assert "apex" not in new.replace("(apex keeps", ""), new
    lines = new.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("scaler = torch.amp.GradScaler("))
    marker = max(i for i, line in enumerate(lines[:at]) if "TODO(ampmigrate)" in line)
    assert all(line.strip().startswith("#") for line in lines[marker:at]), new


def test_an_arm_importing_something_else_stays():
    source = _script("from_apex", "negated", "per_loss").replace("            from apex import amp\n",
                                                                 "            from apex import amp\n            import os\n", 1)
    result = migrate_source(source, "train.py")
    assert result.new_source == source
    assert any("in arms that exclude each other" in d.message for d in result.diagnostics), [d.message for d in result.diagnostics]


@pytest.mark.slow
@pytest.mark.parametrize(("imports", "test", "losses"), [("from_apex", "negated", "per_loss"), ("import_as", "plain", "one_scaler")])
def test_the_rewrite_trains_the_same_each_way(tmp_path, imports, test, losses):
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    original = tmp_path / "original.py"
    original.write_text(_script(imports, test, losses))
    migrated = tmp_path / "migrated.py"
    migrated.write_text(migrate_source(original.read_text(), "train.py").new_source)
    assert migrated.read_text() != original.read_text()
    for argv in ([], ["--fp16"], ["--fp16", "--gt"]):
        result = compare(Target(str(original)), Target(str(migrated)), argv, device="cpu", steps=5, parallel=True, timeout=600)
        assert result.verdict == SAME, as_text(result)
