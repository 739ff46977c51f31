"""A method scales a loss it computes from what its caller's forward pass made
(``out = self.model(x)``, then ``self.update(out, y)``): apex cast that forward pass too, so the
caller's forward goes under an autocast of its own, enabled as the method's region. Judged by
running in ``tests/generated`` (``Features.backward_in="update"``); here, each spelling."""
import itertools
import textwrap

import libcst as cst
import pytest

from migrate.api import migrate_source

TRAINER = '''\
import torch
import torch.nn.functional as F
from apex import amp


class Trainer:
    def __init__(self, model, optimizer, use_amp):
        self.model, self.optimizer, self.use_amp = model, optimizer, use_amp
        {initialize}

    def update(self, {param}, y):
        loss = F.mse_loss({read}, y)
        {backward}
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss
{caller}'''
INITIALIZE = {
    "always": 'self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1")',
    "flag": 'if use_amp:\n            self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1")',
}
BACKWARD = {
    "always": "with amp.scale_loss(loss, self.optimizer) as scaled_loss:\n            scaled_loss.backward()",
    "flag": ("if self.use_amp:\n            with amp.scale_loss(loss, self.optimizer) as scaled_loss:\n"
             "                scaled_loss.backward()\n        else:\n            loss.backward()"),
}
ENABLED = {"always": "", "flag": ", enabled=self.scaler.is_enabled()"}
# what the caller's forward makes, and how the method reads it
OUTPUTS = {
    "plain": ("out = self.model(x)", "out", "out", "out"),
    "tuple": ("out, feats = self.model(x), None", "out", "out", "out"),
    "dict": ('out = {"pred": self.model(x)}', "out", "outputs", 'outputs["pred"]'),
    "two lines": ("hidden = self.model(x)\nout = hidden * 2", "out", "out", "out"),
}
CALLERS = {
    "method": lambda made, handed: (
        "\n    def fit(self, batches):\n        for x, y in batches:\n"
        + textwrap.indent(made, " " * 12) + f"\n            self.update({handed}, y)\n"),
    "method, keyword": lambda made, handed: (
        "\n    def fit(self, batches):\n        for x, y in batches:\n"
        + textwrap.indent(made, " " * 12) + f"\n            loss = self.update(y=y, {{param}}={handed})\n"),
    "method, in an arm": lambda made, handed: (
        "\n    def fit(self, batches):\n        for step, (x, y) in enumerate(batches):\n            if step % 2 == 0:\n"
        + textwrap.indent(made, " " * 16) + f"\n                self.update({handed}, y)\n"),
}


def autocast_holding(source: str, line: str) -> list[str]:
    """The ``with torch.autocast(...)`` calls whose blocks hold ``line``."""
    found = []

    class Visitor(cst.CSTVisitor):
        def visit_With(self, node: cst.With) -> None:
            call = cst.Module([]).code_for_node(node.items[0].item)
            if call.startswith("torch.autocast(") and line in cst.Module([]).code_for_node(node.body):
                found.append(" ".join(call.split()).replace("( ", "(").replace(",)", ")").replace(" )", ")"))

    cst.parse_module(source).visit(Visitor())
    return found


def trainer(setup, output, caller) -> str:
    made, handed, param, read = OUTPUTS[output]
    text = TRAINER.format(initialize=INITIALIZE[setup], param=param, read=read, backward=BACKWARD[setup],
                          caller=CALLERS[caller](made, handed))
    return text.replace("{param}", param)


@pytest.mark.parametrize("setup,output,caller", list(itertools.product(INITIALIZE, OUTPUTS, CALLERS)))
def test_the_callers_forward_goes_under_autocast(setup, output, caller):
    result = migrate_source(trainer(setup, output, caller), filename="train.py")
    assert result.error is None and "from apex" not in result.new_source, result.new_source
    region = f'torch.autocast("cuda", dtype=torch.float16{ENABLED[setup]})'
    forward = OUTPUTS[output][0].splitlines()[0]
    assert autocast_holding(result.new_source, forward) == [region], result.new_source
    assert autocast_holding(result.new_source, "loss = F.mse_loss(") == [region], result.new_source
    assert autocast_holding(result.new_source, "self.update(") == [], result.new_source


def test_what_the_caller_hands_in_is_data_not_a_forward():
    text = trainer("always", "plain", "method").replace("out = self.model(x)", "out = x * 2")
    result = migrate_source(text, filename="train.py")
    assert result.error is None and autocast_holding(result.new_source, "out = x * 2") == [], result.new_source


def test_a_caller_where_the_scaler_is_not_seen_leaves_it_unsafe():
    """The scaler is a local of the function that initializes, and may be off: an autocast in
    the module-level caller could not ask it whether it is on."""
    text = textwrap.dedent('''\
        import torch
        import torch.nn.functional as F
        from apex import amp


        def update(model, optimizer, out, y, use_amp):
            loss = F.mse_loss(out, y)
            if use_amp:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()


        def main(model, optimizer, batches, use_amp):
            if use_amp:
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x, y in batches:
                out = model(x)
                update(model, optimizer, out, y, use_amp)
        ''')
    safe = migrate_source(text, filename="train.py")
    unsafe = migrate_source(text, filename="train.py", unsafe_fixes=True)
    reasons = " ".join(d.fix.why_unsafe for d in unsafe.diagnostics if d.fix)
    assert safe.new_source == text or "handed in at line 21" not in reasons, safe.new_source


# the loss computed in part above the `if` that holds the scaled backward, in part in its arm
ABOVE = {
    "one line": "loss = F.mse_loss(out, y)",
    "two lines": "base = F.mse_loss(out, y)\nloss = base + 0.0",
    "augmented": "loss = 0.0\nloss += F.mse_loss(out, y)",
}
IN_THE_ARM = {"divided": "loss = loss / 2", "augmented": "loss /= 2", "a term added": "loss = loss + 0.1 * out.pow(2).mean()",
              # a forward pass in the arm: its region, and what it carries on from above
              "a forward added": "loss = loss + 0.1 * self.model(y).pow(2).mean()",
              "in a block of its own": "if y.numel() > 1:\n    loss = loss / 2"}
ARMS = {
    "amp first": "if self.use_amp:\n{arm}\n    with amp.scale_loss(loss, self.optimizer) as scaled_loss:\n"
                 "        scaled_loss.backward()\nelse:\n    loss.backward()",
    "plain first": "if not self.use_amp:\n    loss.backward()\nelse:\n{arm}\n"
                   "    with amp.scale_loss(loss, self.optimizer) as scaled_loss:\n        scaled_loss.backward()",
}
SPLIT = '''\
import torch
import torch.nn.functional as F
from apex import amp


class Trainer:
    def __init__(self, model, optimizer, use_amp):
        self.model, self.optimizer, self.use_amp = model, optimizer, use_amp
        if use_amp:
            self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1")

    def update(self, out, y):
        self.optimizer.zero_grad()
{above}
{backward}
        self.optimizer.step()
        return loss

    def fit(self, batches):
        for x, y in batches:
            out = self.model(x)
            self.update(out, y)
'''


def split_loss(above: str, arm: str, arms: str) -> str:
    backward = ARMS[arms].format(arm=textwrap.indent(arm, "    "))
    return SPLIT.format(above=textwrap.indent(above, " " * 8), backward=textwrap.indent(backward, " " * 8))


@pytest.mark.parametrize("above,arm,arms", list(itertools.product(ABOVE, IN_THE_ARM, ARMS)))
def test_a_loss_computed_above_the_if_and_in_its_arm_goes_under_autocast_in_both(above, arm, arms):
    result = migrate_source(split_loss(ABOVE[above], IN_THE_ARM[arm], arms), filename="train.py")
    assert result.error is None and "from apex" not in result.new_source, result.new_source
    region = 'torch.autocast("cuda", dtype=torch.float16, enabled=self.scaler.is_enabled())'
    computing = [line for line in ABOVE[above].splitlines() if line != "loss = 0.0"]  # a constant is no computation
    for line in (*computing, IN_THE_ARM[arm].splitlines()[-1].strip(), "out = self.model(x)"):
        assert autocast_holding(result.new_source, line) == [region], (line, result.new_source)
    assert autocast_holding(result.new_source, "loss = 0.0") == [], result.new_source
    assert autocast_holding(result.new_source, "self.optimizer.zero_grad()") == [], result.new_source
    compile(result.new_source, "train.py", "exec")


def test_a_loss_the_arm_computes_anew_leaves_what_is_above_outside():
    result = migrate_source(split_loss("unused = F.mse_loss(out, y)", "loss = F.l1_loss(out, y)", "amp first"),
                            filename="train.py")
    assert autocast_holding(result.new_source, "loss = F.l1_loss(out, y)"), result.new_source
    assert autocast_holding(result.new_source, "unused = F.mse_loss(out, y)") == [], result.new_source


@pytest.mark.parametrize("arm", ['print("mixed")', 'print("mixed")\nloss = loss / 2'])
def test_an_arm_running_something_else_first_is_climbed_out_of(arm):
    source = split_loss("loss = F.mse_loss(out, y)", arm, "amp first")
    result = migrate_source(source, filename="train.py")
    assert "from apex" not in result.new_source, result.new_source
    region = 'torch.autocast("cuda", dtype=torch.float16, enabled=self.scaler.is_enabled())'
    assert autocast_holding(result.new_source, "loss = F.mse_loss(out, y)") == [region], result.new_source
    assert autocast_holding(result.new_source, 'print("mixed")') == [], result.new_source


def test_data_moved_above_the_arm_stays_outside():
    source = split_loss("y = y.cuda()\nloss = F.mse_loss(out, y)", "loss = loss / 2", "amp first")
    result = migrate_source(source, filename="train.py")
    assert autocast_holding(result.new_source, "loss = F.mse_loss(out, y)"), result.new_source
    assert autocast_holding(result.new_source, "y = y.cuda()") == [], result.new_source


# `amp.initialize` handed lists of models and optimizers (one objective each): the loop takes
# each model from the list, and its forward pass goes under the region
LISTS = '''\
import torch
from apex import amp


def fit(loss_models, optimizers, batches, use_apex_amp):
    if use_apex_amp:
{initialize}
    for x, y in batches:
{loop}
            loss_value = loss_model(x, y)
            if use_apex_amp:
                with amp.scale_loss(loss_value, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss_value.backward()
            optimizer.step()
            optimizer.zero_grad()
'''
TAKEN = {
    "subscript": "        for index in range(len(loss_models)):\n"
                 "            loss_model = loss_models[index]\n            optimizer = optimizers[index]",
    "zip": "        for loss_model, optimizer in zip(loss_models, optimizers):\n            pass",
    "enumerate": "        for index, loss_model in enumerate(loss_models):\n            optimizer = optimizers[index]",
}


INITIALIZED = {
    "the lists": '        loss_models, optimizers = amp.initialize(loss_models, optimizers, opt_level="O1")',
    "each element": ("        for index in range(len(loss_models)):\n"
                     '            model, optimizer = amp.initialize(loss_models[index], optimizers[index], opt_level="O1")\n'
                     "            loss_models[index] = model\n            optimizers[index] = optimizer"),
}


@pytest.mark.parametrize("initialized", sorted(INITIALIZED))
@pytest.mark.parametrize("taken", sorted(TAKEN))
def test_a_model_taken_from_the_list_initialize_was_handed_runs_under_autocast(taken, initialized):
    # a scaler made in a loop inside the `if` is unsafe for a reason of its own: judged with --unsafe-fixes
    unsafe = initialized == "each element"
    result = migrate_source(LISTS.format(loop=TAKEN[taken], initialize=INITIALIZED[initialized]), filename="train.py",
                            unsafe_fixes=unsafe)
    assert result.error is None and "from apex" not in result.new_source, result.new_source
    region = 'torch.autocast("cuda", dtype=torch.float16, enabled=scaler.is_enabled())'
    found = autocast_holding(result.new_source, "loss_value = loss_model(x, y)")
    assert len(found) == 1 and (found == [region] or unsafe), result.new_source
    reasons = " ".join(d.fix.why_unsafe for d in result.diagnostics if d.fix and d.fix.why_unsafe)
    assert "forward call is not seen" not in reasons and (unsafe or not reasons), reasons


def test_a_forward_above_a_test_of_the_loss_in_a_file_that_only_scales_is_enabled_by_the_flag():
    """No ``initialize`` here (another file's): the regions are enabled by the arm the scaled
    backward runs in, less the test of what the region computes (``if loss is not None:``)."""
    source = textwrap.dedent('''\
        import torch
        from apex import amp


        def train(model, optimizer, batches, args):
            for batch in batches:
                batch = tuple(t.cuda() for t in batch)
                loss, accuracy = model.train_step(batch[0], batch[1])
                if loss is not None:
                    if args.accumulation > 1:
                        loss = loss / args.accumulation
                    if args.fp16:
                        with amp.scale_loss(loss, optimizer) as scaled_loss:
                            scaled_loss.backward()
                    else:
                        loss.backward()
                    optimizer.step()
        ''')
    result = migrate_source(source, filename="train.py", unsafe_fixes=True)
    region = 'torch.autocast("cuda", dtype=torch.float16, enabled=bool(args.fp16))'
    assert autocast_holding(result.new_source, "loss, accuracy = model.train_step(") == [region], result.new_source
    assert autocast_holding(result.new_source, "loss = loss / args.accumulation") == [region], result.new_source
    assert autocast_holding(result.new_source, "batch = tuple(") == [], result.new_source
