"""A ``try`` that imports ``amp`` and something of apex the rewrite keeps (``apex.contrib``, which has
no native counterpart), then sets ``has_apex = True``, with ``except ImportError: has_apex = False``.
After the rewrite the kept import still fails without apex, so ``has_apex`` is still False there and
mixed precision stays off as before: the fixes must not say those runs now use it
(Alibaba-MIIL/Solving_ImageNet's ``train.py`` kept ``from apex.parallel import DistributedDataParallel``
and its notes said so). They say the change comes once the other imports go too, naming them:
the plan cannot know whether their own fixes remove them (a later round's removal of the ``try``
reports nothing), and where they do, as ``apex.parallel``'s here, the change is there."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

SCRIPT = """\
import torch

{default}try:
    {amp_import}
    {other_import}
{flag_set}except ImportError:
    {handler}


def train(args, model, optimizer, loader):
    if args.apex_amp and has_apex:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    {other_use}
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        if args.apex_amp and has_apex:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""
AMP_IMPORTS = ["from apex import amp", "import apex.amp as amp"]
KEPT = {  # an apex import the rewrite keeps, and its use
    "contrib": ("from apex.contrib.xentropy import SoftmaxCrossEntropyLoss", "criterion = SoftmaxCrossEntropyLoss()"),
    "contrib_module": ("import apex.contrib.clip_grad as apex_clip", "clip = apex_clip.clip_grad_norm_"),
}
REWRITTEN = {  # an apex import the rewrite removes too
    "ddp": ("from apex.parallel import DistributedDataParallel as ApexDDP",
            "if args.distributed:\n        model = ApexDDP(model)"),
}
FLAGS = {  # how the flag tells a run without apex
    "except_sets": ("", "    has_apex = True\n", "has_apex = False"),
    "skipped": ("has_apex = False\n", "    has_apex = True\n", "print('apex is not installed')"),
}
NOW_ON = "native torch.amp needs no install, so those runs now use it"
THEN_ON = "native torch.amp needs no install, so those runs then use it"


def _script(amp_import: str, other: tuple[str, str], flag: str) -> str:
    default, flag_set, handler = FLAGS[flag]
    source = SCRIPT.format(default=default, amp_import=amp_import, other_import=other[0], flag_set=flag_set,
                           handler=handler, other_use=other[1])
    compile(source, "train.py", "exec")
    return source


def _said(source: str, unsafe: bool) -> tuple[str, str]:
    result = migrate_source(source, "train.py", unsafe_fixes=unsafe)
    assert result.error is None, result.error
    said = " ".join(" ".join(f"{d.message} {d.fix.message if d.fix else ''}".split()) for d in result.diagnostics)
    return result.new_source or source, said


@pytest.mark.parametrize("amp_import, kept, flag, unsafe",
                         list(itertools.product(AMP_IMPORTS, KEPT, FLAGS, (False, True))))
def test_a_guard_still_failing_without_apex_is_no_behaviour_change(amp_import, kept, flag, unsafe):
    new, said = _said(_script(amp_import, KEPT[kept], flag), unsafe)
    assert KEPT[kept][0] in new and "has_apex = True" in new  # the guard still fails without apex
    assert NOW_ON not in said, said
    named = KEPT[kept][0].replace("from ", "").replace(" import ", ".").split(" as ")[0].replace("import ", "")
    assert f"behaviour change once this `try`'s other apex imports (`{named}`) go too" in said and THEN_ON in said, said


@pytest.mark.parametrize("amp_import, flag", list(itertools.product(AMP_IMPORTS, FLAGS)))
def test_a_guard_that_goes_keeps_the_note(amp_import, flag):
    for unsafe in (False, True):
        new, said = _said(_script(amp_import, REWRITTEN["ddp"], flag), unsafe)
        if "from apex" not in new and "import apex" not in new:
            assert "other apex imports (`apex.parallel.DistributedDataParallel`) go too" in said and THEN_ON in said, said
            return
    pytest.fail("the apex imports stayed in both modes")


# `import apex` serves amp and what else the file reads of it: the kept reads keep the import
PLAIN_IMPORTS = {"import apex": "apex", "import apex as apx": "apx"}
PLAIN_USES = {
    "kept": ("criterion = {name}.contrib.xentropy.SoftmaxCrossEntropyLoss()", "apex.contrib"),
    "kept_twice": ("clip = {name}.contrib.clip_grad.clip_grad_norm_; mlp = {name}.mlp.MLP([4, 4])", "apex.contrib`, `apex.mlp"),
}


def _plain_script(statement: str, use: str, flag: str) -> str:
    name = PLAIN_IMPORTS[statement]
    source = _script(statement, ("", use.format(name=name)), flag)
    return source.replace("amp.initialize", f"{name}.amp.initialize").replace("amp.scale_loss", f"{name}.amp.scale_loss")


@pytest.mark.parametrize("statement, use, flag, unsafe",
                         list(itertools.product(PLAIN_IMPORTS, PLAIN_USES, FLAGS, (False, True))))
def test_a_plain_apex_import_serving_more_than_amp_is_no_behaviour_change(statement, use, flag, unsafe):
    new, said = _said(_plain_script(statement, PLAIN_USES[use][0], flag), unsafe)
    assert statement in new and "has_apex = True" in new, new  # the guard still fails without apex
    assert NOW_ON not in said, said
    assert f"behaviour change once this `try`'s other apex imports (`{PLAIN_USES[use][1]}`) go too" in said and THEN_ON in said, said


@pytest.mark.parametrize("statement, flag", list(itertools.product(PLAIN_IMPORTS, FLAGS)))
def test_a_plain_apex_import_serving_amp_alone_keeps_the_note(statement, flag):
    new, said = _said(_plain_script(statement, "pass", flag), False)
    assert statement not in new and "has_apex" not in new, new
    assert NOW_ON in said and "other apex imports" not in said, said
