"""The same ``amp.initialize`` in two functions of a file: a subclass's ``train()`` overriding its
base's, or two entry points (``train()`` and ``finetune()``). apex started a fresh loss scaler at
each call; the rewrite makes a GradScaler afresh at each, placed as the first (at the top of its
function, or before an ``if`` of the same test), so every run trains as it did on apex.

Generated over: the holder (methods of a class and its subclass, with the model and the scaler
on ``self`` or not, or two functions), whether the
call sits under a flag, how the flag is spelled, which of the two runs (or both, one after the
other), and the order of the two definitions. Other placements and options stay unsafe."""
from __future__ import annotations

import itertools

import pytest

from generated.small_scripts import compared, script_head
from migrate.api import migrate_source

FLAGS = {"none": None, "attribute": "args.amp", "negated": "not args.fp32"}
RUNS = ("first", "second", "both")


def _initialize(flag: str | None, options: str = "opt_level='O1'", model: str = "model", optimizer: str = "optimizer") -> list[str]:
    call = f"{model}, {optimizer} = amp.initialize({model}, {optimizer}, {options})"
    return [call] if flag is None else [f"if {flag}:", f"    {call}"]


def _loop(flag: str | None, seed_offset: int) -> list[str]:
    scaled = ["with amp.scale_loss(loss, optimizer) as scaled_loss:", "    scaled_loss.backward()"]
    backward = scaled if flag is None else [f"if {flag}:", *("    " + line for line in scaled), "else:", "    loss.backward()"]
    return [f"torch.manual_seed({seed_offset})",
            "model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)",
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.05)",
            "<initialize>",
            "for step in range(args.steps):",
            "    x = torch.randn(16, 8, device=device)",
            "    loss = model(x).pow(2).mean()",
            "    optimizer.zero_grad()",
            *("    " + line for line in backward),
            "    optimizer.step()",
            "    losses.append(float(loss))"]


def _script(holder: str, flag_name: str, run: str, base_first: bool, second_initialize: list[str] | None = None) -> str:
    flag = FLAGS[flag_name]
    head = script_head('parser.add_argument("--amp", type=int, default=1)\nparser.add_argument("--fp32", type=int, default=0)\n')
    bodies = []
    for index, initialize in enumerate((_initialize(flag), second_initialize or _initialize(flag))):
        lines = []
        for line in _loop(flag, index):
            lines += initialize if line == "<initialize>" else [line]
        bodies.append(lines)
    if holder == "class":
        first = ["class Trainer:", "    def train(self):", *("        " + line for line in bodies[0])]
        second = ["class FineTuner(Trainer):", "    def train(self):", *("        " + line for line in bodies[1])]
        calls = {"first": ["Trainer().train()"], "second": ["FineTuner().train()"], "both": ["Trainer().train()", "FineTuner().train()"]}
        definitions = first + ["", ""] + second  # a subclass follows its base
    else:
        first = ["def train():", *("    " + line for line in bodies[0])]
        second = ["def finetune():", *("    " + line for line in bodies[1])]
        calls = {"first": ["train()"], "second": ["finetune()"], "both": ["train()", "finetune()"]}
        definitions = (first + ["", ""] + second) if base_first else (second + ["", ""] + first)
    return head + "losses = []\n\n\n" + "\n".join(definitions) + "\n\n\n" + "\n".join(calls[run]) + "\nprint(losses[-1])\n"


def _on_self(flag_name: str, run: str) -> str:
    """A trainer keeping its model and optimizer on ``self``, the loop in a shared ``step()``: the
    scaler lives on ``self`` too."""
    flag = FLAGS[flag_name]
    initialize = _initialize(flag, "opt_level='O1'", "self.model", "self.optimizer")
    scaled = ["with amp.scale_loss(loss, self.optimizer) as scaled_loss:", "    scaled_loss.backward()"]
    backward = scaled if flag is None else [f"if {flag}:", *("    " + line for line in scaled), "else:", "    loss.backward()"]
    lines = ["class Trainer:", "    def __init__(self, seed):", "        torch.manual_seed(seed)",
             "        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)",
             "        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)", "",
             "    def step(self, x):", "        loss = self.model(x).pow(2).mean()", "        self.optimizer.zero_grad()",
             *("        " + line for line in backward), "        self.optimizer.step()", "        losses.append(float(loss))", ""]
    for name, scale in (("Trainer", "1.0"), ("FineTuner", "0.5")):
        if name == "FineTuner":
            lines += ["", "class FineTuner(Trainer):"]
        lines += ["    def train(self):", *("        " + line for line in initialize),
                  "        for _ in range(args.steps):", f"            self.step(torch.randn(16, 8, device=device) * {scale})"]
    calls = {"first": ["Trainer(0).train()"], "second": ["FineTuner(1).train()"], "both": ["Trainer(0).train()", "FineTuner(1).train()"]}
    head = script_head('parser.add_argument("--amp", type=int, default=1)\nparser.add_argument("--fp32", type=int, default=0)\n')
    return head + "losses = []\n\n\n" + "\n".join(lines) + "\n\n\n" + "\n".join(calls[run]) + "\nprint(losses[-1])\n"


VARIANTS = [(holder, flag, run, base_first) for holder, flag, run, base_first in itertools.product(("class", "functions"), FLAGS, RUNS, (True, False))
            if holder == "functions" or base_first] + [("self", flag, run, True) for flag, run in itertools.product(FLAGS, RUNS)]


@pytest.mark.parametrize("holder, flag, run, base_first", VARIANTS)
def test_the_same_initialize_in_another_function_is_migrated_safely(holder, flag, run, base_first):
    source = _on_self(flag, run) if holder == "self" else _script(holder, flag, run, base_first)
    result = migrate_source(source, filename="train.py")
    new = result.new_source
    assert "apex" not in new, "\n".join(d.message + " " + (d.fix.why_unsafe if d.fix else "") for d in result.diagnostics)
    assert new.count("= torch.amp.GradScaler(") >= 2  # made afresh where each `initialize` was
    assert "global " not in new  # each function's own, or `self`'s: no module global assigned through `global`
    compile(new, "train.py", "exec")
    assert migrate_source(new, filename="train.py").new_source == new  # idempotent


@pytest.mark.parametrize("second, why", [
    (["if args.fp32:", "    model, optimizer = amp.initialize(model, optimizer, opt_level='O1')"], "another test"),
    (["model, optimizer = amp.initialize(model, optimizer, opt_level='O1', loss_scale=128.0)"], "other options"),
    (["for _ in range(1):", "    model, optimizer = amp.initialize(model, optimizer, opt_level='O1')"], "in a loop"),
])
def test_an_initialize_placed_or_set_otherwise_stays_unsafe(second, why):
    source = _script("functions", "attribute" if second[0].startswith("if") else "none", "second", True, second)
    result = migrate_source(source, filename="train.py")
    assert "apex" in result.new_source, why
    assert "`amp.initialize` is called 2 times" in " ".join(d.fix.why_unsafe for d in result.diagnostics if d.fix), why


@pytest.mark.slow
@pytest.mark.parametrize("holder, flag, run", [("class", "attribute", "second"), ("functions", "negated", "both"),
                                               ("functions", "none", "second"), ("self", "attribute", "both")])
def test_a_rewrite_of_the_same_initialize_in_another_function_trains_the_same(tmp_path, holder, flag, run):
    from ampshim.compare import SAME
    from ampshim.compare.report import as_text

    source = _on_self(flag, run) if holder == "self" else _script(holder, flag, run, True)
    result = compared(tmp_path, source, migrate_source(source, filename="train.py").new_source, "rewritten", steps=20)
    assert result.verdict == SAME, as_text(result)


def test_a_scaler_read_by_a_third_function_stays_a_module_global():
    """Both functions call ``save()``, which reads the scaler: it stays one module global both reach."""
    source = _script("functions", "none", "both", True)
    source = source.replace("        losses.append(float(loss))\n", "        losses.append(float(loss))\n    save()\n")
    source = source.replace("losses = []\n", "losses = []\nstates = []\n\n\ndef save():\n    states.append(amp.state_dict())\n", 1)
    assert source.count("    save()\n") == 2
    new = migrate_source(source, filename="train.py").new_source
    assert "apex" not in new and new.count("global scaler") == 2
    assert "states.append(scaler.state_dict())" in new
    compile(new, "train.py", "exec")
