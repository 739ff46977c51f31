"""A large module's definitions that no rule reads stay text, and every rule finds and fixes the same."""
from __future__ import annotations

import re
from pathlib import Path

import libcst as cst
import pytest

from migrate.engine import run_rules
from migrate.parsing import parse_module
from migrate.prefilter import PLAIN_RUN_WORDS
from migrate.rules import all_rules, select_rules
from migrate.unread import Unparsed

REPO = Path(__file__).resolve().parents[2]
_DEFINED = re.compile(r"^(?:def|class) (\w+)", re.MULTILINE)

HEAD = "import torch\nimport torch.nn as nn\nfrom apex import amp\n\n\n"
TRAIN = (
    "def train(model, optimizer, loader):\n"
    "    model, optimizer = amp.initialize(model, optimizer, opt_level='O1')\n"
    "    for x, y in loader:\n"
    "        loss = model(x).sum()\n"
    "        with amp.scale_loss(loss, optimizer) as scaled:\n"
    "            scaled.backward()\n"
    "        optimizer.step()\n"
)
MODEL = (
    "class Net(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.fc = nn.Linear(4, 4)  # a comment\n"
    "\n"
    "    def forward(self, x):\n"
    "        return self.fc(x)\n"
)
EVALUATE = (
    "@torch.no_grad()\n"
    "def evaluate(model, batches):\n"
    "    return sum(model(x).sum().item() for x in batches)\n"
)
TAIL = "\n\nif __name__ == '__main__':\n    print('done')\n"


def _module(*definitions: str) -> str:
    return HEAD + "\n\n".join(definitions) + TAIL


def _unparsed(text: str) -> set[str]:
    """The names of the definitions left unparsed in ``text``'s tree (pieces of one statement)."""
    module = parse_module(text, piece_size=1, words=PLAIN_RUN_WORDS)
    assert module.code == text
    return {name for part in module.body if type(part) is Unparsed for name in _DEFINED.findall(part.code)}


def test_definitions_nothing_links_to_a_rule_stay_text():
    assert _unparsed(_module(MODEL, TRAIN, EVALUATE)) == {"Net", "evaluate"}


def test_the_tree_is_libcsts_but_for_the_unparsed_statements_and_generates_the_same_text():
    text = _module("# above the model\n" + MODEL, EVALUATE, TRAIN, "# column 0\n\n" + EVALUATE.replace("evaluate", "score"))
    whole = cst.parse_module(text)
    module = parse_module(text, piece_size=1, words=PLAIN_RUN_WORDS)

    assert module.code == text
    assert _same(module.header, whole.header) and _same(module.footer, whole.footer)
    statements = iter(whole.body)
    kinds = []
    for part in module.body:
        if type(part) is Unparsed:  # its leading lines as libcst has them, then the statements' text
            kinds.append("text")
            covered = [next(statements) for _ in range(part.statements)]
            assert cst.Module(body=()).code_for_node(part) == "".join(cst.Module(body=()).code_for_node(s) for s in covered)
            assert _same(part.leading_lines, covered[0].leading_lines)
        else:
            kinds.append("tree")
            assert part.deep_equals(next(statements))
    assert next(statements, None) is None
    assert kinds == ["tree"] * 3 + ["text"] + ["tree"] + ["text"] + ["tree"]  # imports, then Net and evaluate one run


def _same(nodes, others) -> bool:
    return len(nodes) == len(others) and all(node.deep_equals(other) for node, other in zip(nodes, others))


@pytest.mark.parametrize(
    ("definition", "why"),
    [
        ("def helper(loss):\n    return loss * 2\n", "a parsed statement names it"),
        ("def main():\n    train(None, None, [])\n", "it names a parsed definition"),
        ("def make(model):\n    return FP16_Optimizer(model)\n", "it names what an apex import binds"),
        ("def clip(model):\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n", "gradients"),
        ("def restore(model, path):\n    model.load_state_dict(torch.load(path))\n", "a checkpoint"),
        ("def count():\n    global seen\n    seen = 1\n", "it binds a module name"),
        ("def print(*args):\n    pass\n", "it shadows a builtin"),
        ("def nn():\n    pass\n", "it shadows an import"),
        ("def use_amp():\n    return True\n", "a trigger word"),
    ],
)
def test_definitions_a_rule_may_read_are_parsed(definition, why):
    name = definition.split("(")[0].split()[-1]
    train = TRAIN.replace("        optimizer.step()\n", "        optimizer.step()\n        helper(loss)\n")
    text = _module(MODEL, definition, train).replace("from apex import amp\n", "from apex import amp\nfrom apex.fp16_utils import FP16_Optimizer\n")

    assert name not in _unparsed(text), why
    assert ("Net" in _unparsed(text)) is (name != "nn")  # Net names nn: the parsed def of it links Net in


def test_a_definition_bound_twice_is_parsed():
    assert _unparsed(_module(MODEL, TRAIN, MODEL)) == set()


def test_a_star_import_of_apex_leaves_nothing_unparsed():
    assert _unparsed(_module(MODEL, TRAIN).replace("from apex import amp", "from apex.amp import *")) == set()
    assert _unparsed(_module(MODEL, TRAIN).replace("import torch\n", "from os.path import *\n", 1)) == {"Net"}


def test_without_trigger_words_everything_is_parsed():
    text = _module(MODEL, TRAIN, EVALUATE)
    module = parse_module(text, piece_size=1)

    assert not any(type(part) is Unparsed for part in module.body)
    assert module.deep_equals(cst.parse_module(text))


def test_findings_after_unparsed_definitions_are_where_they_are_in_the_file(monkeypatch):
    text = _module(MODEL, EVALUATE, TRAIN, MODEL.replace("Net", "Other"), TRAIN.replace("def train", "def train_more"))
    rules = tuple(all_rules())

    def findings() -> list:
        return [(d.code, d.location, d.end_location) for d in run_rules(text, "t.py", rules, fix=False).diagnostics]

    monkeypatch.setattr("migrate.parsing.PIECE_SIZE", 10**9)
    whole = findings()
    monkeypatch.setattr("migrate.parsing.PIECE_SIZE", 1)
    unparsed = findings()

    assert unparsed == whole
    last = text.splitlines().index("def train_more(model, optimizer, loader):") + 1
    assert any(location.row > last for _, location, _ in whole)


LEGACY_HANDLE = """import torch
from apex import amp


def setup():
    handle = amp.init()


def helper(x):
    handle = x
    return handle


def train(model, optimizer, loss):
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
"""
IMPORT_AFTER_DEFINITIONS = """import os
from apex import amp


class Net:
    size = torch.Size([1])


import torch


def train(model, optimizer, loss):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("text", [LEGACY_HANDLE, IMPORT_AFTER_DEFINITIONS], ids=["a name counted", "a name used before its import"])
def test_questions_about_the_whole_module_read_the_unparsed_text(text, monkeypatch):
    rules = tuple(select_rules(["ALL"]))
    monkeypatch.setattr("migrate.parsing.PIECE_SIZE", 10**9)
    whole = run_rules(text, "t.py", rules, unsafe_fixes=True)
    monkeypatch.setattr("migrate.parsing.PIECE_SIZE", 1)
    unparsed = run_rules(text, "t.py", rules, unsafe_fixes=True)

    assert _unparsed(text) & {"helper", "Net"}
    assert unparsed == whole
    assert whole.diagnostics


def _examples() -> list[tuple[str, str]]:
    """Each rule's examples, the golden rewrites and the legacy scripts: (name, text). The corpus
    fixtures are test_parsing's."""
    found = []
    for rule in all_rules():
        for index, example in enumerate([*rule.VALID, *rule.INVALID]):
            found.append((f"{rule.CODE}-{index}", example.code))
    for folder in ("legacy", "migrate"):
        for path in sorted((REPO / "fixtures" / folder).rglob("*.py")):
            found.append((str(path.relative_to(REPO)), path.read_text(encoding="utf-8")))
    return found


@pytest.mark.slow
def test_every_example_and_fixture_is_checked_and_fixed_the_same_with_definitions_unparsed(monkeypatch):
    rules = tuple(select_rules(["ALL"]))
    examples = _examples()

    def results() -> list:
        return [run_rules(text, name, rules, unsafe_fixes=True) for name, text in examples]

    monkeypatch.setattr("migrate.parsing.PIECE_SIZE", 10**9)
    whole = results()
    monkeypatch.setattr("migrate.parsing.PIECE_SIZE", 1)
    unparsed = results()

    assert len(examples) > 300
    assert unparsed == whole
