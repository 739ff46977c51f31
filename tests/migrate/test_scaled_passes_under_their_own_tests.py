"""Scaled backward passes each under a test of its own, one after the other in the iteration
(``if args.doc_loss: ...scale_loss...`` then ``if args.wiki_loss: ...scale_loss...``), then one
gradient read (a clip) and the step. Where both tests hold both passes ran and the gradients are
unscaled once: GradScaler raises at a second ``unscale_`` before the update. The read is preceded
by one ``unscale_``, under either test (as the step goes through the scaler), or under none where
one pass always runs."""
from __future__ import annotations

import ast
import itertools
import textwrap

import pytest

from migrate.api import migrate_source

SCRIPT = '''\
import torch
from apex import amp


def train(args, net, opt, batches):
    net, opt = amp.initialize(net, opt, opt_level="O1")
    for step, x in enumerate(batches):
{passes}
{read}
        opt.step()
        net.zero_grad()
'''
PASS = '''\
out = net(x{shift})
part = (out - {target}).pow(2).mean() / args.accumulate
with amp.scale_loss(part, opt) as scaled_part:
    scaled_part.backward()
'''
# how each pass's test is spelled (None: the pass always runs)
TESTS = {
    "compared": ["args.doc_loss == 1", "args.wiki_loss == 1", "args.ent_loss == 1"],
    "flags": ["args.doc", "args.wiki", "args.ent"],
    "negated": ["not args.no_doc", "not args.no_wiki", "not args.no_ent"],
    "one_always": [None, "args.wiki", "args.ent"],
}
READS = {
    "master_params": "torch.nn.utils.clip_grad_norm_(amp.master_params(opt), 1.0)",
    "parameters": "torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)",
    "norm": "norm = sum(p.grad.norm() ** 2 for p in net.parameters() if p.grad is not None)\nprint(norm)",
}


def _script(tests, read: str, guarded: bool) -> str:
    passes = []
    for index, test in enumerate(tests):
        body = PASS.format(shift=f" * {index + 1}", target=index)
        passes.append(body if test is None else f"if {test}:\n" + textwrap.indent(body, "    "))
    read_lines = f"if (step + 1) % args.accumulate == 0:\n{textwrap.indent(read, '    ')}" if guarded else read
    if guarded:  # the step and its clear under the same test as the read
        return SCRIPT.format(passes=textwrap.indent("".join(passes), " " * 8),
                             read=textwrap.indent(read_lines, " " * 8)).replace(
            "        opt.step()\n        net.zero_grad()", "            opt.step()\n            net.zero_grad()")
    return SCRIPT.format(passes=textwrap.indent("".join(passes), " " * 8), read=textwrap.indent(read_lines, " " * 8))


@pytest.mark.parametrize("tests, count, read, guarded", list(itertools.product(TESTS, [2, 3], READS, [False, True])))
def test_passes_under_their_own_tests_unscale_once_before_the_read(tests, count, read, guarded):
    spelled = TESTS[tests][:count]
    result = migrate_source(_script(spelled, READS[read], guarded), filename="train.py")
    assert result.changed and "amp." not in result.new_source.replace("torch.amp.", ""), [
        d.message for d in result.diagnostics]
    tree = ast.parse(result.new_source)
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(".unscale_")]
    assert len(calls) == 1, result.new_source
    guard = next((node for node in ast.walk(tree) if isinstance(node, ast.If)
                  and any(inner is calls[0] for inner in ast.walk(node)) and "unscale_" in ast.unparse(node.body[0])
                  and len(node.body) == 1), None)
    if None in spelled:
        assert guard is None, result.new_source  # one pass always runs: so does the unscale
    else:
        held = {ast.unparse(ast.parse(test).body[0].value) for test in spelled}
        operands = ast.parse(ast.unparse(guard.test)).body[0].value
        assert isinstance(operands, ast.BoolOp) and isinstance(operands.op, ast.Or), ast.unparse(guard.test)
        assert {ast.unparse(value) for value in operands.values} == held


RUNNABLE = '''\
import argparse

import torch

{train}

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-doc", dest="doc", action="store_false")
    parser.add_argument("--wiki", action="store_true")
    parser.add_argument("--accumulate", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    batches = [torch.randn(16, 8, device="cuda") for _ in range(4)] * 10
    train(args, net, opt, batches)


if __name__ == "__main__":
    main()
'''


@pytest.mark.slow
@pytest.mark.parametrize("read", ["master_params", "norm"])
def test_both_passes_then_one_clip_train_as_apex_did(read, tmp_path):
    """By running: both tests holding (two passes, one unscale), one of them, each alone."""
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    source = RUNNABLE.format(train=_script(["args.doc", "args.wiki"], READS[read], True).replace(
        "import torch\nfrom apex import amp\n", "from apex import amp\n"))
    (tmp_path / "original.py").write_text(source)
    (tmp_path / "rewritten.py").write_text(migrate_source(source, filename="train.py").new_source)
    for args in (["--wiki"], [], ["--no-doc", "--wiki"]):
        comparison = compare(Target(str(tmp_path / "original.py")), Target(str(tmp_path / "rewritten.py")), args,
                             device="cpu", steps=15, parallel=True, timeout=240)
        assert comparison.verdict == SAME, " ".join(args) + "\n" + as_text(comparison)
