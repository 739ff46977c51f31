"""``--check`` says what a fixing run will leave: its "remaining" is the fixing run's, and that is
what the next ``--check`` finds. A finding inside a statement a fix removes (the availability
check under an `if` that goes with apex) goes with it; a marker a fix writes is a finding after."""
from __future__ import annotations

import re
import textwrap

import pytest
from click.testing import CliRunner

from migrate.cli import main

SCRIPT = '''\
import argparse

import torch

try:
    from apex import amp
except ImportError:
    amp = None


def train(level):
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    sgd = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    if level != "O0":
        net, sgd = amp.initialize(net, sgd, opt_level=level)
    step = 0
    while step < 3:
        error = (net(torch.randn(2, 4)) - 1.0).pow(2).mean()
        if level == "O0":
            error.backward()
        else:
            with amp.scale_loss(error, sgd) as scaled:
                scaled.backward()
        sgd.step()
        sgd.zero_grad(set_to_none=True)
        step += 1


def evaluate(level):
    model = torch.nn.Linear(4, 1)
{inference}    return model(torch.randn(2, 4))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--opt-level", default="O1")
    args = parser.parse_args()
{check}    train(args.opt_level)


main()
'''

# the availability check, spelled as real code spells it: inside what the fix removes, or kept
CHECKS = {
    "assert": 'if args.opt_level != "O0":\n    assert amp is not None, "amp not installed!"\n',
    "raise": 'if args.opt_level != "O0" and amp is None:\n    raise ImportError("install apex")\n',
    "nested": 'if args.opt_level != "O0":\n    if amp is None:\n        raise ImportError("install apex")\n',
    "print": 'if amp is None:\n    print("apex is missing")\n',
    "turns-off": 'if amp is None:\n    args.opt_level = "O0"\n',
}
# an inference initialize: the unsafe fix leaves a TODO marker, a finding of the fixed text
INFERENCE = {"none": "", "initialize": 'model = amp.initialize(model, opt_level="O1")\n'}


def _counts(output: str) -> tuple[int, int]:
    """(found, remaining) from the summary line."""
    if "All checked!" in output:
        return 0, 0
    found = re.search(r"Found (\d+) findings? \((\d+) fix\w+, (\d+) remaining\)", output)
    assert found, output
    return int(found.group(1)), int(found.group(3))


@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe"])
@pytest.mark.parametrize("inference", INFERENCE.values(), ids=INFERENCE.keys())
@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
def test_check_says_what_the_fixing_run_leaves(check, inference, unsafe, tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT.format(check=textwrap.indent(check, "    "), inference=textwrap.indent(inference, "    ")))
    flags = ["--unsafe-fixes"] if unsafe else []

    def run(*args):
        return CliRunner().invoke(main, [*args, *flags, str(tmp_path)], catch_exceptions=False).output

    _, predicted = _counts(run("--check"))
    _, left = _counts(run())
    found_next, _ = _counts(run("--check"))
    assert predicted == left == found_next, (predicted, left, found_next)
