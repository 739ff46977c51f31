"""A forward pass with gradients off in the training loop (a memory bank, pseudo-labels or targets
filled under ``torch.no_grad()``) goes under an autocast of its own, enabled as the loop's region:
apex O1 cast every forward pass once ``initialize`` ran, and what it computes feeds later losses.
Judged by running in ``tests/generated`` (``Features.memory``) and below; here, each spelling."""
import itertools
import textwrap

import libcst as cst
import pytest

from migrate.api import migrate_source

SETUPS = {
    # initialize and the scaled backward always: the region is always on
    "always": ("    model, optimizer = amp.initialize(model, optimizer, opt_level=\"O1\")\n",
               "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
               "            scaled_loss.backward()\n", ""),
    # under a flag, a plain backward else: the region is on where the scaler is
    "flag": ("    if use_amp:\n        model, optimizer = amp.initialize(model, optimizer, opt_level=\"O1\")\n",
             "        if use_amp:\n            with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
             "                scaled_loss.backward()\n        else:\n            loss.backward()\n",
             ", enabled=scaler.is_enabled()"),
}
CONTEXTS = {"torch.no_grad()": "", "torch.inference_mode()": "", "torch.autograd.no_grad()": "",
            "no_grad()": "from torch import no_grad\n"}
CALLS = ["model(x)", "model.forward(x)"]
REGION = 'torch.autocast("cuda", dtype=torch.float16'  # one the rewrite made
# where the block stands in the loop: its lines, at the loop body's depth
PLACES = {
    "loop": lambda block: block,
    "arm": lambda block: "if len(y) > 1:\n" + textwrap.indent(block, "    ") + "else:\n    pass\n",
    "inner_loop": lambda block: "for _ in range(2):\n" + textwrap.indent(block, "    "),
    "try": lambda block: "try:\n" + textwrap.indent(block, "    ") + "except RuntimeError:\n    pass\n",
}


def source(setup: str, context: str, call: str, place: str, reader: bool = True) -> str:
    initialize, backward, _ = SETUPS[setup]
    block = f"with {context}:\n    out = {call}\n" + ("bank = out.mean()\n" if reader else "")
    placed = textwrap.indent(PLACES[place](block), "        ")
    return (f"import torch\nimport torch.nn.functional as F\n{CONTEXTS[context]}from apex import amp\n\n\n"
            "def train(model, optimizer, batches, use_amp):\n" + initialize + "    bank = 0.0\n"
            "    for x, y in batches:\n"
            "        loss = F.mse_loss(model(x), y + bank)\n"
            "        optimizer.zero_grad()\n" + backward + "        optimizer.step()\n" + placed)


def autocast_around(new_source: str, context: str) -> list[tuple[str, list[str]]]:
    """Each ``with torch.autocast(...)`` holding a ``with <context>:``: its call, and the code of
    the statements it holds."""
    found = []

    class Visitor(cst.CSTVisitor):
        def visit_With(self, node: cst.With) -> None:
            call = node.items[0].item
            if isinstance(call, cst.Call) and cst.Module([]).code_for_node(call.func) == "torch.autocast":
                held = [cst.Module([]).code_for_node(statement).strip() for statement in node.body.body]
                if any(line.startswith(f"with {context}:") for line in held):
                    found.append((cst.Module([]).code_for_node(call), held))

    cst.parse_module(new_source).visit(Visitor())
    return found


@pytest.mark.parametrize("setup,context,call,place", list(itertools.product(SETUPS, CONTEXTS, CALLS, PLACES)))
def test_a_forward_pass_without_gradients_in_the_loop_goes_under_autocast(setup, context, call, place):
    result = migrate_source(source(setup, context, call, place), filename="train.py")
    assert result.error is None and "apex" not in result.new_source, result.new_source
    regions = autocast_around(result.new_source, context)
    assert len(regions) == 1, result.new_source
    head, held = regions[0]
    expected = f'torch.autocast("cuda", dtype=torch.float16{SETUPS[setup][2]})'
    assert head.replace("\n", "").replace("    ", "") == expected, head  # laid out to the line length or not
    # the line after the block computes from what it made: apex cast its ops too
    assert held[-1] == "bank = out.mean()" and len(held) == 2, result.new_source


def test_a_line_after_the_block_that_reads_nothing_it_made_stays_outside():
    text = source("always", "torch.no_grad()", "model(x)", "loop", reader=False) + "        print(len(y))\n"
    result = migrate_source(text, filename="train.py")
    (_, held), = autocast_around(result.new_source, "torch.no_grad()")
    assert held == [held[0]] and "print(len(y))" not in held[0]


@pytest.mark.parametrize("block,why", [
    ("with torch.no_grad():\n    ema.update(model)\n", "the model handed on, not run"),
    ("with torch.no_grad(), torch.autocast(\"cuda\", enabled=False):\n    out = model(x)\n",
     "its own autocast decides"),
    ("with torch.no_grad():\n    out = other(x)\n", "nothing treats it as a network (no eval(), no parameters())"),
    ("with torch.enable_grad():\n    out = model(x)\n", "gradients on: not a pass this covers"),
])
def test_what_is_left_alone(block, why):
    text = (source("always", "torch.no_grad()", "model(x)", "loop", reader=False)
            .replace("        with torch.no_grad():\n            out = model(x)\n", textwrap.indent(block, "        ")))
    result = migrate_source(text.replace("def train(model,", "def train(ema, other, model,"), filename="train.py")
    assert result.error is None
    assert result.new_source.count(REGION) == 1, (why, result.new_source)


def test_an_evaluation_after_the_loop_is_not_the_training_loop():
    text = source("always", "torch.no_grad()", "model(x)", "loop", reader=False)
    text = text.replace("        with torch.no_grad():\n            out = model(x)\n", "") + (
        "    with torch.no_grad():\n        print(model(x))\n")
    result = migrate_source(text, filename="train.py")
    assert result.new_source.count(REGION) == 1, result.new_source


def test_a_method_holding_the_model_on_self():
    text = textwrap.dedent('''\
        import torch
        import torch.nn.functional as F
        from apex import amp


        class Trainer:
            def __init__(self, model, optimizer):
                self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")
                self.bank = 0.0

            def fit(self, batches):
                for x, y in batches:
                    loss = F.mse_loss(self.model(x), y + self.bank)
                    with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                        scaled_loss.backward()
                    self.optimizer.step()
                    self.optimizer.zero_grad()
                    self.model.eval()
                    with torch.no_grad():
                        self.bank = self.model(x).mean()
                    self.model.train()
        ''')
    result = migrate_source(text, filename="train.py")
    assert "apex" not in result.new_source
    (head, held), = autocast_around(result.new_source, "torch.no_grad()")
    assert head == 'torch.autocast("cuda", dtype=torch.float16)' and len(held) == 1


@pytest.mark.parametrize("scaled_in", ["method", "function"])
def test_the_loss_scaled_by_a_helper_the_loop_calls(scaled_in):
    """The region is the caller's (around the forward before ``self.backward(loss)``): so is the
    loop whose no-grad block goes under autocast."""
    helper = ("    def backward(self, loss):\n        with amp.scale_loss(loss, self.optimizer) as scaled:\n"
              "            scaled.backward()\n" if scaled_in == "method" else "")
    function = ("\n\ndef backward(loss, optimizer):\n    with amp.scale_loss(loss, optimizer) as scaled:\n"
                "        scaled.backward()\n" if scaled_in == "function" else "")
    call = "self.backward(loss)" if scaled_in == "method" else "backward(loss, self.optimizer)"
    text = ("import torch\nimport torch.nn.functional as F\nfrom apex import amp\n" + function + "\n\nclass Trainer:\n"
            "    def __init__(self, model, optimizer):\n"
            "        self.model, self.optimizer = amp.initialize(model, optimizer, opt_level=\"O1\")\n\n"
            + helper + "\n    def fit(self, batches):\n        bank = 0.0\n        for x, y in batches:\n"
            "            loss = F.mse_loss(self.model(x), y + bank)\n"
            f"            {call}\n            self.optimizer.step()\n            self.optimizer.zero_grad()\n"
            "            with torch.no_grad():\n                bank = self.model(x).mean()\n")
    result = migrate_source(text, filename="train.py")
    assert "apex" not in result.new_source, result.new_source
    (head, held), = autocast_around(result.new_source, "torch.no_grad()")
    heads = [cst.Module([]).code_for_node(node.items[0].item) for node in
             cst.parse_module(result.new_source).body[-1].body.body[-1].body.body[-1].body.body
             if isinstance(node, cst.With)]
    assert heads == [head, head] and len(held) == 1  # enabled as the training region


# Another network (a teacher, a flow network): the file treats it as one, and under O1 apex's
# process-wide casts ran its pass in float16 too.
NETWORKS = {"local": ("teacher", "teacher = copy.deepcopy(model)\n"),
            "attribute": ("args.flownet", "args.flownet = copy.deepcopy(model)\n")}
TREATED = ["{}.eval()", "{}.train(False)", "{}.requires_grad_(False)", "{}.load_state_dict(model.state_dict())",
           "for p in {}.parameters():\n    p.requires_grad = False"]
LEVELS = {"literal": 'opt_level="O1"', "default": "", "computed": "opt_level=args.opt_level"}


def another_network(network: str, treated: str, level: str, where: str) -> str:
    name, made = NETWORKS[network]
    block = f"with torch.no_grad():\n    bank = {name}(x).mean()\n"
    before, after = (block, "") if where == "before" else ("", block)
    level_arg = f", {LEVELS[level]}" if LEVELS[level] else ""
    return ("import copy\n\nimport torch\nimport torch.nn.functional as F\nfrom apex import amp\n\n\n"
            "def train(model, optimizer, batches, args):\n"
            f"    model, optimizer = amp.initialize(model, optimizer{level_arg})\n"
            + textwrap.indent(made + treated.format(name) + "\n", "    ") + "    bank = 0.0\n"
            "    for x, y in batches:\n" + textwrap.indent(before, "        ")
            + "        loss = F.mse_loss(model(x), y + bank)\n        optimizer.zero_grad()\n"
            "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n            scaled_loss.backward()\n"
            "        optimizer.step()\n" + textwrap.indent(after, "        "))


@pytest.mark.parametrize("network,treated,level,where",
                         list(itertools.product(NETWORKS, TREATED, LEVELS, ["before", "after"])))
def test_another_network_under_o1_goes_under_autocast(network, treated, level, where):
    """Under an autocast of its own, or the training region's where the loss reads what it made."""
    result = migrate_source(another_network(network, treated, level, where), filename="train.py")
    assert result.error is None and "from apex import" not in result.new_source
    (head, held), = autocast_around(result.new_source, "torch.no_grad()")
    enabled = ", enabled=scaler.is_enabled()" if level == "computed" else ""
    assert head == f'torch.autocast("cuda", dtype=torch.float16{enabled})', result.new_source
    # before the forward, the loss reads what it made: one region from it on, not two side by side
    assert len(held) == 1 if where == "after" else held[-1].startswith("loss ="), result.new_source


@pytest.mark.parametrize("network", NETWORKS)
@pytest.mark.parametrize("level", ['opt_level="O2"', "opt_level=args.opt_level"])
def test_another_network_under_o2_as_autocast_is_left_alone(network, level):
    """O2 cast only the models it was given: the other network's pass ran in float32."""
    text = another_network(network, "{}.eval()", "literal", "after").replace('opt_level="O1"', level)
    result = migrate_source(text, filename="train.py", settings={"o2-as-autocast": True})
    assert result.error is None and "from apex import" not in result.new_source, result.new_source
    assert autocast_around(result.new_source, "torch.no_grad()") == [], result.new_source


def test_an_evaluation_of_another_network_after_the_loop_is_left_alone():
    text = another_network("local", "{}.eval()", "literal", "after")
    text = text.replace("        with torch.no_grad():\n            bank", "    with torch.no_grad():\n        bank")
    result = migrate_source(text, filename="train.py")
    assert result.error is None and autocast_around(result.new_source, "torch.no_grad()") == [], result.new_source


# a pass through a method of the network, not its `__call__` (a VQ encoder's `encode`, an `infer`)
METHOD_CALLS = ["{}.encode(x)", "{}.infer(x)", "{}.extract_features(x)[0]", "{}.module.encode(x)"]


@pytest.mark.parametrize("network,call,where", list(itertools.product(NETWORKS, METHOD_CALLS, ["before", "after"])))
def test_another_networks_pass_through_a_method_goes_under_autocast(network, call, where):
    name, _ = NETWORKS[network]
    text = another_network(network, "{}.eval()", "literal", where).replace(f"bank = {name}(x).mean()",
                                                                           f"bank = {call.format(name)}.mean()")
    result = migrate_source(text, filename="train.py")
    assert result.error is None and "from apex import" not in result.new_source
    (head, held), = autocast_around(result.new_source, "torch.no_grad()")
    assert head == 'torch.autocast("cuda", dtype=torch.float16)' and call.format(name) in held[0], result.new_source


@pytest.mark.parametrize("call", ["model.embed(x)", "model.module.embed(x)"])
def test_the_trained_models_own_method_in_a_block_without_gradients_goes_under_autocast(call):
    text = source("always", "torch.no_grad()", "model(x)", "loop").replace("out = model(x)", f"out = {call}")
    result = migrate_source(text, filename="train.py")
    (_, held), = autocast_around(result.new_source, "torch.no_grad()")
    assert call in held[0], result.new_source


@pytest.mark.parametrize("managed", ["teacher.state_dict()", "teacher.eval()", "list(teacher.parameters())",
                                     "teacher.to(x.device)"])
def test_a_block_only_managing_another_network_is_left_alone(managed):
    """Copying its weights, switching its mode, moving it: nothing apex cast."""
    text = another_network("local", "{}.eval()", "literal", "after").replace("bank = teacher(x).mean()",
                                                                              f"kept = {managed}")
    result = migrate_source(text, filename="train.py")
    assert result.error is None and autocast_around(result.new_source, "torch.no_grad()") == [], result.new_source
