"""An inference-only ``amp.initialize`` (no optimizers) removed beside the training one, in the
other arm of an ``if`` (``if args.do_train: ... else: if args.fp16: from apex import amp; model =
amp.initialize(model, ...)``): its marker stands where it stood, in that arm, saying to run the
model under autocast (the marker once joined the file's, at the training call, and the arm went:
in another function that said nothing of where); it is not counted as a second call sharing the
one GradScaler (it trains nothing)."""
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
    lines = new.splitlines()
    arm = lines.index("    else:")
    inference_arm = lines[arm:] if training_first else lines[:arm]
    marker = " ".join(line.strip(" #") for line in inference_arm if line.lstrip().startswith("#"))
    assert "TODO(ampmigrate): run `model` under torch.autocast" in marker and "apex cast it from here on" in marker, new
    assert "called 2 times" not in new, new
    # still unsafe: a safe run leaves the file alone
    assert migrate_source(source, "train.py").new_source in (None, source)
