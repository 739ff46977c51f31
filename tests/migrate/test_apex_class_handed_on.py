"""An apex class used as a value (``optim_classes = dict(sgd=FusedSGD)``, ``impl = FusedSGD``) is
called elsewhere with arguments the rewrite may not see: apex's own (``wd_after_momentum``,
``set_grad_none``; ``delay_allreduce``) raise TypeError on the native class, and the options the
rewrite adds to a call (DDP's ``find_unused_parameters``) would be missing. It is swapped only
where every call made with it is seen and the native class takes that call as it is."""
from __future__ import annotations

import pytest

from migrate.api import migrate_source

SGD = "from apex.optimizers import FusedSGD\n"
DDP = "from apex.parallel import DistributedDataParallel\n"

UNSEEN = {
    "dict": (SGD, "OPTIMIZERS = dict(sgd=FusedSGD)\n\n\ndef build(name, params, conf):\n    return OPTIMIZERS[name](params, **conf)\n"),
    "dict_literal": (SGD, "OPTIMIZERS = {'sgd': FusedSGD}\n"),
    "returned": (SGD, "def optimizer_class():\n    return FusedSGD\n"),
    "handed": (SGD, "def build(params, make):\n    return make(params)\n\n\nopt = build(params, FusedSGD)\n"),
    "star_call": (SGD, "impl = FusedSGD\nopt = impl(params, **conf)\n"),
    "apex_only_keyword": (SGD, "impl = FusedSGD\nopt = impl(params, lr=0.1, wd_after_momentum=True)\n"),
    "name_read_otherwise": (SGD, "impl = FusedSGD\nprint(impl.__name__)\nopt = impl(params, lr=0.1)\n"),
    "ddp_alias": (DDP, "wrapper = DistributedDataParallel\nmodel = wrapper(model, delay_allreduce=True)\n"),
    "ddp_plain_alias": (DDP, "wrapper = DistributedDataParallel\nmodel = wrapper(model)\n"),
}
SEEN = {
    "alias_called": (SGD, "impl = FusedSGD\nopt = impl(params, lr=0.1, momentum=0.9)\n", "impl = torch.optim.SGD"),
    "alias_beside_a_default": (SGD, "impl = torch.optim.SGD\nif fast:\n    impl = FusedSGD\nopt = impl(params, lr=0.1, nesterov=True)\n",
                               "    impl = torch.optim.SGD"),
    "class_check": (SGD, "ok = isinstance(opt, FusedSGD)\n", "isinstance(opt, torch.optim.SGD)"),
    "ddp_check": (DDP, "wrapped = isinstance(model, DistributedDataParallel)\n",
                  "isinstance(model, torch.nn.parallel.DistributedDataParallel)"),
    "tuple_check": (DDP, "model = DistributedDataParallel(model)\nwhile isinstance(model, (Wrapper, DistributedDataParallel)):\n"
                         "    model = model.module\n", "isinstance(model, (Wrapper, torch.nn.parallel.DistributedDataParallel))"),
    "conditional_alias": (DDP, "DDP = DistributedDataParallel if with_apex else TorchDDP\nok = isinstance(model, DDP)\n", None),
}


@pytest.mark.parametrize("case", UNSEEN)
def test_a_class_handed_on_is_reported_not_swapped(case):
    imports, body = UNSEEN[case]
    source = imports + "\n" + body
    for unsafe in (False, True):
        result = migrate_source(source, "train.py", unsafe_fixes=unsafe)
        assert result.new_source == source, result.new_source
        assert any(d.code in ("AMP010", "AMP013") and "not rewritten" in d.message for d in result.diagnostics)


@pytest.mark.parametrize("case", SEEN)
def test_a_class_whose_every_use_is_seen_is_swapped(case):
    imports, body, expected = SEEN[case]
    new = migrate_source(imports + "\n" + body, "train.py").new_source
    if expected is None:  # a name used only in class checks: the alias changes, and every check with it
        assert "torch.nn.parallel.DistributedDataParallel if with_apex" in new and "from apex" not in new, new
        return
    assert expected in new and "apex" not in new, new
