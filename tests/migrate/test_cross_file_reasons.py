"""The reasons a split pair gives for an unsafe rewrite say what the rewrite writes: "autocast" only
where the scale half gets an autocast region, and no "the scaler is off for O0" where the scaler is
made in the other file, on for every opt level the run may pick."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from generated.small_scripts import SCALE_HALF
from migrate.api import migrate_paths

# The scale half: the forward pass beside the scaled backward (an autocast region is written), or
# the loss handed in by a runner (no forward pass here: a marker asks for one by hand).
LOSS_HANDED_IN = """from apex import amp


class Hook:
    def after_iter(self, runner):
        runner.optimizer.zero_grad()
        with amp.scale_loss(runner.outputs["loss"], runner.optimizer) as scaled_loss:
            scaled_loss.backward()
        runner.optimizer.step()
"""
SCALE_HALVES = {"forward": SCALE_HALF, "handed in": LOSS_HANDED_IN}

TRAIN = """import torch
from apex import amp

from engine import {imported}


def main(model, optimizer, cfg):
{body}    return model, optimizer
"""
# the last two: a level O2 by the file's argparse default, and by a config the project ships
LEVELS = ("cfg.opt_level", "'O1' if cfg.half else 'O0'", "levels[cfg.level]", "args.opt_level", "cfg.amp_level")
SCALES = ("", ", loss_scale='dynamic'", ", loss_scale=cfg.loss_scale")
GUARDS = ("", "if cfg.mixed:\n")


def _train(level: str, scale: str, guard: str, imported: str) -> str:
    call = f"model, optimizer = amp.initialize(model, optimizer, opt_level={level}{scale})\n"
    body = ("    levels = {'a': 'O0', 'b': 'O1'}\n" if "levels" in level else "") + (
        f"    {guard}        {call}" if guard else f"    {call}")
    text = TRAIN.format(imported=imported, body=body)
    if level == "args.opt_level":
        text = text.replace("\n\n\ndef main", '\nparser = argparse.ArgumentParser()\nparser.add_argument("--opt_level", default="O2")\n'
                            "args = parser.parse_args()\n\n\ndef main", 1).replace("import torch\n", "import argparse\n\nimport torch\n", 1)
    return text


def _reasons(result) -> str:
    return " ".join(d.fix.why_unsafe for d in result.diagnostics if d.fix is not None)


@pytest.mark.parametrize("half, level, scale, guard", list(itertools.product(SCALE_HALVES, LEVELS, SCALES, GUARDS)))
def test_the_reasons_of_a_pair_name_only_what_its_rewrite_writes(tmp_path, half, level, scale, guard):
    (tmp_path / "engine.py").write_text(SCALE_HALVES[half])
    imported = "train_epoch" if half == "forward" else "Hook"
    (tmp_path / "train.py").write_text(_train(level, scale, guard, imported))
    (tmp_path / "config.yaml").write_text("amp_level: O2\n")
    results = {Path(result.filename).name: result for result in migrate_paths([tmp_path], unsafe_fixes=True)}
    engine = (tmp_path / "engine.py").read_text()
    assert all(result.changed for result in results.values()), _reasons(results["train.py"])
    reasons = _reasons(results["train.py"]) + " " + _reasons(results["engine.py"]) + engine
    assert "opt level is computed at run time" in reasons
    # the scale half's GradScaler is made at module level, on whatever level the run picks
    assert 'scaler = torch.amp.GradScaler("cuda")' in engine
    assert "off for O0" not in reasons
    if half == "forward":
        assert "with torch.autocast(" in engine
        assert "gets an O1 GradScaler and autocast" in reasons
    else:
        assert "with torch.autocast(" not in engine and "(the forward pass) under" in engine  # a marker asks for it
        assert "autocast are" not in reasons and "GradScaler and autocast" not in reasons
        assert "gets an O1 GradScaler" in reasons
    if guard:
        assert "runs inside a block here" in reasons
