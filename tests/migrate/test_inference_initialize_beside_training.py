"""An inference-only ``amp.initialize`` (no optimizers) removed beside the training one, in the
other arm of an ``if`` (``if args.do_train: ... else: if args.fp16: from apex import amp; model =
amp.initialize(model, ...)``), goes with the ``if`` holding it and the arm it empties, not left as
``else: if args.fp16: pass``; the file's marker says what to do by hand, and does not count it as
a second call sharing the one GradScaler (it trains nothing)."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

INFERENCE = {
    "guarded": "        if args.fp16:\n            model = amp.initialize(model, opt_level=args.opt_level)\n",
    "guarded_import": "        if args.fp16:\n            from apex import amp\n            model = amp.initialize(model, opt_level=args.opt_level)\n",
    "plain": '        model = amp.initialize(model, opt_level="O1")\n',
    "after_a_line": '        model.eval()\n        model = amp.initialize(model, opt_level="O1")\n',
}
TRAINING = ("        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "        model, optimizer = amp.initialize(model, optimizer, opt_level='O1')\n")
STEP = ("    if args.do_train:\n        for x in loader:\n            loss = model(x).sum()\n"
        "            with amp.scale_loss(loss, optimizer) as scaled_loss:\n                scaled_loss.backward()\n"
        "            optimizer.step()\n")


@pytest.mark.parametrize("inference, training_first", list(itertools.product(INFERENCE, [True, False])))
def test_the_removed_inference_initialize_leaves_no_empty_arm(inference, training_first):
    arms = ("    if args.do_train:\n" + TRAINING + "    else:\n" + INFERENCE[inference]) if training_first else (
        "    if not args.do_train:\n" + INFERENCE[inference] + "    else:\n" + TRAINING)
    source = "import torch\nfrom apex import amp\n\n\ndef main(args, model, loader):\n" + arms + STEP
    result = migrate_source(source, "train.py", unsafe_fixes=True)
    new = result.new_source
    assert new is not None and "from apex" not in new, new
    compile(new, "train.py", "exec")
    code = "\n".join(line for line in new.splitlines() if not line.lstrip().startswith("#"))
    if training_first:  # inference first, the arm it empties holds the file's marker (above `pass`)
        assert "pass" not in code and ("else:" not in code or inference == "after_a_line"), new
    assert "inference ran under apex's casts" in new.replace("\n    #  ", "") and "called 2 times" not in new, new
    # still unsafe: a safe run leaves the file alone
    assert migrate_source(source, "train.py").new_source in (None, source)
