"""An inference ``amp.initialize(model, opt_level="O1")`` (no optimizer) before an evaluation, then a
call that trains (``train(args, model)``, which initializes and scales on its own): the autocast
region standing for apex's casts stops before that call. Around it, the training loop's own
regions would be nested, and autocast clears its cast weights only where the outermost region
exits: every step after the first would run the first step's weights."""
from __future__ import annotations

import ast
import itertools
import textwrap

import pytest

from migrate.api import migrate_source

SCRIPT = '''\
import torch
import torch.nn as nn
import torch.nn.functional as F
from apex import amp

{helpers}

def evaluate(model, x):
    with torch.no_grad():
        return float(model(x).mean())


def main(resume):
    torch.manual_seed(0)
    model = nn.Linear(8, 1).cuda()
    x = torch.randn(16, 8).cuda()
{arm}
'''
TRAIN_FUNCTION = '''
def train(model, x):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
    for _ in range(4):
{step}
'''
STEP = '''\
loss = F.mse_loss(model(x), x[:, :1])
with amp.scale_loss(loss, optimizer) as scaled_loss:
    scaled_loss.backward()
optimizer.step()
optimizer.zero_grad()'''
# how the arm reaches the training loop
TRAINING = {
    "function": (TRAIN_FUNCTION.format(step=textwrap.indent(STEP, " " * 8)), "train(model, x)"),
    "nested": (TRAIN_FUNCTION.replace("def train(", "def fit(").format(step=textwrap.indent(STEP, " " * 8))
               + "\n\ndef train(model, x):\n    fit(model, x)\n", "train(model, x)"),
    "method": ("\nclass Trainer:\n" + textwrap.indent(TRAIN_FUNCTION.replace("(model, x)", "(self, model, x)")
                                                     .format(step=textwrap.indent(STEP, " " * 8)), " " * 4),
               "Trainer().train(model, x)"),
    # not of the file: a function named for training, handed the model
    "imported": ("\nfrom finetuning import fit_model\n", "fit_model(model, x)"),
}
ARMS = {
    "flagged": "    if resume:\n        model = amp.initialize(model, opt_level=\"O1\", verbosity=0)\n{after}",
    "plain": "    model = amp.initialize(model, opt_level=\"O1\", verbosity=0)\n{after}",
}
AFTER = {"evaluation_first": ["print(evaluate(model, x))", "{train}"],
         "loaded_then_evaluated": ["model.load_state_dict(model.state_dict())", "print(evaluate(model, x))", "{train}"]}


def _source(training: str, arm: str, after: str) -> tuple[str, str]:
    helpers, call = TRAINING[training]
    indent = " " * (8 if arm == "flagged" else 4)
    lines = "\n".join(indent + line.format(train=call) for line in AFTER[after])
    return SCRIPT.format(helpers=helpers, arm=ARMS[arm].format(after=lines)), call


def _regions(source: str) -> list[ast.With]:
    return [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.With)
            and any("autocast" in ast.unparse(item.context_expr) for item in node.items)]


@pytest.mark.parametrize("training, arm, after", list(itertools.product(TRAINING, ARMS, AFTER)))
def test_the_region_of_an_inference_initialize_stops_before_the_training_call(training, arm, after):
    source, call = _source(training, arm, after)
    new = migrate_source(source, "train.py").new_source
    main = new[new.index("def main("):]
    regions = _regions(main)
    assert regions and all(call not in ast.unparse(region) for region in regions), main
    assert any("evaluate(model, x)" in ast.unparse(region) for region in regions), main
    assert call in main and "amp.initialize" not in new, new


def test_a_model_run_after_the_training_call_leaves_the_inference_initialize_alone():
    """The evaluation after training ran under apex's casts too, but no region can hold it without
    holding the training call."""
    source, _ = _source("function", "plain", "evaluation_first")
    source = source.rstrip("\n") + "\n    print(evaluate(model, x))\n"
    new = migrate_source(source, "train.py").new_source
    assert 'model = amp.initialize(model, opt_level="O1", verbosity=0)' in new, new
