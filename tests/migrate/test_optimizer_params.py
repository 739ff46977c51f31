"""``amp.master_params(optimizer)`` becomes ``model.parameters()`` exactly where the optimizer was
made from them and nothing since changed what either holds; elsewhere the optimizer's own groups.
Generated variants, run after the rewrite: what the clip is handed is, tensor for tensor and in
order, what the optimizer steps."""
from __future__ import annotations

import textwrap
import warnings

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from migrate.api import migrate_source

CONSTRUCTIONS = {  # how the optimizer is made from the model's parameters, and the import it needs
    "dotted": ("torch.optim.SGD(model.parameters(), lr=0.1)", ""),
    "keyword": ("SGD(params=model.parameters(), lr=0.1)", "from torch.optim import SGD\n"),
    "module": ("optim.Adam(model.parameters())", "from torch import optim\n"),
    "submodule": ("torch.optim.SGD(model[0].parameters(), lr=0.1)", ""),  # a part: never the model's
}
AFTERWARDS = {  # what runs between the optimizer's construction and the clip; exact: same parameters
    "nothing": ("", True),
    "wrapped": ("model = torch.nn.DataParallel(model)\n", True),
    "other_model": ("model = torch.nn.Sequential(torch.nn.Linear(3, 1))\n", False),
    "new_optimizer": ("optimizer = torch.optim.SGD(model.parameters(), lr=0.2)\n", True),  # made again
    "added_group": ("optimizer.add_param_group({\"params\": [extra]})\n", False),
    "replaced_params": ("optimizer.param_groups[0][\"params\"] = [extra]\n", False),
    "logged_lr": ("print(optimizer.param_groups[0][\"lr\"])\n", True),
    # both bound by one statement, each from its own part (flow.bindings.parts)
    "wrapped_beside": ("model, optimizer = torch.nn.DataParallel(model), optimizer\n", True),
    "other_model_beside": ("model, spare = torch.nn.Sequential(torch.nn.Linear(3, 1)), model\n", False),
    "unpacked_from_a_call": ("model, optimizer = (lambda m, o: (m, o))(model, optimizer)\n", False),
    # on one way through the function only (flow.reaching: every binding that reaches counts)
    "other_model_on_one_arm": ("if use_sgd:\n    model = torch.nn.Sequential(torch.nn.Linear(3, 1))\n", False),
    "wrapped_on_one_arm": ("if use_sgd:\n    model = torch.nn.DataParallel(model)\n", True),
    "new_optimizer_on_one_arm": ("if use_sgd:\n    optimizer = torch.optim.Adam(model.parameters())\n", True),
    "part_optimizer_on_one_arm": ("if use_sgd:\n    optimizer = torch.optim.Adam(model[0].parameters())\n", False),
}
PLACES = {  # where the construction stands; whether it leaves the question to the construction
    "straight": ("optimizer = {made}\n", True),
    "either_arm": ("if use_sgd:\n    optimizer = {made}\nelse:\n    optimizer = torch.optim.Adam(model.parameters())\n", True),
    "a_part_on_the_other_arm": (
        "if use_sgd:\n    optimizer = {made}\nelse:\n    optimizer = torch.optim.Adam(model[2].parameters())\n", False),
    "unless_handed_in": ("if optimizer is None:\n    optimizer = {made}\n", False),
    "in_a_try": ("try:\n    optimizer = {made}\nexcept TypeError:\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)\n", True),
}


def _script(construction: str, afterwards: str, clip_in_loop: bool, place: str = "straight") -> str:
    made, imports = CONSTRUCTIONS[construction]
    clip = "record_clip(amp.master_params(optimizer), 1.0)\n"
    loop = textwrap.dedent("""\
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(model(x), y)
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        """) + textwrap.indent(clip, "    " if clip_in_loop else "") + "    optimizer.step()\n" * clip_in_loop
    if not clip_in_loop:
        loop += "optimizer.step()\n"
    body = ("model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))\n"
            "extra = torch.nn.Parameter(torch.zeros(2))\n"
            + PLACES[place][0].format(made=made) +
            'model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
            + AFTERWARDS[afterwards][0]
            + "batches = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(2)]\n"
            + loop
            + "return optimizer\n")
    return ("import torch\n" + imports + "from apex import amp\n\n\n"
            "def train(record_clip, use_sgd, optimizer=None):\n" + textwrap.indent(body, "    "))


@settings(max_examples=150, deadline=None, database=None)
@given(construction=st.sampled_from(sorted(CONSTRUCTIONS)), afterwards=st.sampled_from(sorted(AFTERWARDS)),
       clip_in_loop=st.booleans(), place=st.sampled_from(sorted(PLACES)), use_sgd=st.booleans())
def test_the_models_parameters_stand_for_the_optimizers_exactly_where_it_holds_them(construction, afterwards, clip_in_loop,
                                                                                     place, use_sgd):
    source = _script(construction, afterwards, clip_in_loop, place)
    result = migrate_source(source, "train.py")
    assert result.error is None, result.error
    fixed = result.new_source
    assert "apex" not in fixed, fixed
    made_exactly = PLACES[place][1] and construction != "submodule"
    exact = AFTERWARDS[afterwards][1] and (made_exactly or afterwards == "new_optimizer")
    assert ("record_clip(model.parameters(), 1.0)" in fixed) == exact, fixed
    assert ("param_groups for p in group" in fixed) == (not exact), fixed
    handed: list[list[int]] = []
    namespace: dict = {}
    exec(compile(fixed, "fixed.py", "exec"), namespace)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a CUDA GradScaler on the CPU disables itself, saying so
        optimizer = namespace["train"](lambda params, _: handed.append([id(p) for p in params]), use_sgd)
    stepped = [id(p) for group in optimizer.param_groups for p in group["params"]]
    assert handed and all(ids == stepped for ids in handed)
