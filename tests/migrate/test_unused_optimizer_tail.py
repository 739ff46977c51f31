"""An ``amp.initialize`` given an optimizer that nothing uses after it (a test script made from
the training script's set-up: ``optimizer = make_optimizer(cfg, model)``, ``model, optimizer =
amp.initialize(model, optimizer, opt_level=amp_opt_level)``, then only the evaluation) readied
its model for inference, as one given no optimizer does: the lines after it, to the end of its
function, go under autocast, on where the level is O1. Generated over the spellings of the
level (also known at run time, where it can be only O0 or O1), of the optimizers given and bound
back, of what the function hands back and of how its caller takes it; the negatives are the
shapes where the optimizer, the model or the level may be used where this does not see."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_paths, migrate_source

from generated.inference_runs import printed_alike

SCRIPT = """import argparse

import torch
from apex import amp


def run_test(model, batches):
    with torch.no_grad():
        return [model(batch) for batch in batches]


def evaluate(args{parameters}):
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(device)
    batches = [torch.randn(4, 8, device=device) for _ in range(3)]
{body}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--opt-level", default="O0", choices=["O0", "O1"])
    args = parser.parse_args(argv)
{caller}


if __name__ == "__main__":
    main()
"""
# the lines setting the level up, the level argument, and the region's `enabled` they give
LEVELS = {
    "literal": ("", 'opt_level="O1"', ""),
    "computed": ('use_mixed_precision = args.dtype == "float16"\namp_opt_level = "O1" if use_mixed_precision else "O0"\n',
                 "opt_level=amp_opt_level", ', enabled=amp_opt_level != "O0"'),
    "inline": ("", 'opt_level="O1" if args.fp16 else "O0"', ', enabled=("O1" if args.fp16 else "O0") != "O0"'),
    "argparse choices": ("", "opt_level=args.opt_level", ', enabled=args.opt_level != "O0"'),
    "assigned in arms": ('if args.fp16:\n    level = "O1"\nelse:\n    level = "O0"\n', "opt_level=level", ', enabled=level != "O0"'),
}
# the optimizers made before the call, and the call (`{level}`: the level argument)
OPTIMIZERS = {
    "pair": ("optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
             "model, optimizer = amp.initialize(model, optimizer, {level})"),
    "thrown away": ("optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n", "model, _ = amp.initialize(model, optimizer, {level})"),
    "keyword": ("optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
                "model, optimizer = amp.initialize(model, optimizers=optimizer, {level})"),
    "a list": ("opt_a = torch.optim.SGD(model.parameters(), lr=0.1)\nopt_b = torch.optim.Adam(model.parameters())\n",
               "model, optimizers = amp.initialize(model, [opt_a, opt_b], {level})"),
    "none": ("", "model = amp.initialize(model, {level})"),
}
# a scheduler made from the optimizer before the call, used nowhere after it
SCHEDULERS = {"none": "", "made": "scheduler = torch.optim.lr_scheduler.StepLR({optimizer}, 1)\n"}
# what the function hands back, and how main() takes it
RETURNS = {
    "nothing": ("print('out', [str(o.dtype) for o in outputs], [round(float(o.float().sum()), 3) for o in outputs])", "evaluate(args)"),
    "the results": ("return outputs", "outputs = evaluate(args)\nprint('out', [str(o.dtype) for o in outputs], [round(float(o.float().sum()), 3) for o in outputs])"),
    "the model, dropped": ("return model, outputs", "_, outputs = evaluate(args)\nprint('out', [str(o.dtype) for o in outputs])"),
    "the model, unread": ("return model, outputs", "net, outputs = evaluate(args)\nprint('out', len(outputs), [str(o.dtype) for o in outputs])"),
}
RESTS = {
    "helper": "outputs = run_test(model, batches)\n",
    "loop": "outputs = []\nwith torch.no_grad():\n    for batch in batches:\n        outputs.append(model(batch))\n",
}


def _indented(lines: str) -> str:
    return "".join(f"    {line}\n" if line else "\n" for line in lines.splitlines())


def _script(level="computed", optimizers="pair", scheduler="made", returned="the model, dropped", rest="helper",
            parameters="") -> str:
    before, argument, _ = LEVELS[level]
    made, call = OPTIMIZERS[optimizers]
    first = made.split(" = ")[0] if made else None
    lines = made + (SCHEDULERS[scheduler].format(optimizer=first) if first else "") + before
    lines += call.format(level=argument) + "\n" + RESTS[rest] + RETURNS[returned][0] + "\n"
    return SCRIPT.format(parameters=parameters, body=_indented(lines).rstrip("\n"), caller=_indented(RETURNS[returned][1]).rstrip("\n"))


# every spelling of each feature, the features cycled against one another
VARIANTS = [
    (level, optimizers, scheduler, returned, rest)
    for (level, optimizers), scheduler, returned, rest in zip(
        itertools.product(LEVELS, OPTIMIZERS), itertools.cycle(SCHEDULERS), itertools.cycle(RETURNS), itertools.cycle(RESTS))
]


def _said(result) -> str:
    return " ".join(d.message + " " + (d.fix.message + " " + d.fix.why_unsafe if d.fix else "") for d in result.diagnostics)


@pytest.mark.parametrize("level, optimizers, scheduler, returned, rest", VARIANTS)
def test_the_lines_after_an_inference_initialize_run_under_autocast(level, optimizers, scheduler, returned, rest):
    source = _script(level, optimizers, scheduler, returned, rest)
    compile(source, "test_net.py", "exec")
    result = migrate_source(source, "test_net.py")
    new = result.new_source
    assert "apex" not in new and "amp.initialize" not in new, new
    assert "TODO(ampmigrate)" not in new and all(d.fix is None or not d.fix.why_unsafe for d in result.diagnostics), _said(result)
    region = f'with torch.autocast("cuda", dtype=torch.float16{LEVELS[level][2]}):'
    assert region in new, new
    # the region holds every line after the call, to the end of the function
    after = new.split(region)[1].split("\n\n\n")[0]
    assert ("run_test(model, batches)" in after or "model(batch)" in after) and RETURNS[returned][0].split("(")[0] in after, new
    assert "GradScaler" not in new, new  # nothing trains: no scaler
    compile(new, "test_net.py", "exec")


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("variant", [VARIANTS[0], VARIANTS[5], pytest.param(VARIANTS[16], marks=pytest.mark.slow),
                                     pytest.param(VARIANTS[22], marks=pytest.mark.slow)])
@pytest.mark.parametrize("argv", [["--fp16", "--dtype", "float16", "--opt-level", "O1"], []])
def test_the_migrated_script_infers_as_apex_did(tmp_path, variant, argv):
    """The original on ampshim (apex's casts from the call on, where the level is O1) and its
    rewrite print the same outputs, in the same precision, with mixed precision on and off."""
    expected = printed_alike(tmp_path, _script(*variant), "test_net.py", argv)
    assert ("bfloat16" in expected) == (bool(argv) or variant[0] == "literal"), expected


# where the optimizer, the model or the level may be used where the rewrite does not see:
# no autocast region; the call is left for the unsafe hand-off it was before
KEPT = {
    "optimizer read after": lambda s: s.replace("    outputs = run_test(", '    print(optimizer.param_groups[0]["lr"])\n    outputs = run_test('),
    "scheduler read after": lambda s: s.replace("    outputs = run_test(", "    print(scheduler.get_last_lr())\n    outputs = run_test("),
    "optimizer kept on an object": lambda s: s.replace("    scheduler = ", "    box = argparse.Namespace()\n    box.optimizer = optimizer\n    scheduler = "),
    "optimizer handed to a call": lambda s: s.replace("    scheduler = ", "    print(optimizer)\n    scheduler = "),
    "optimizer read in a closure": lambda s: s.replace("    scheduler = ", "    def lr():\n        return optimizer.param_groups[0]['lr']\n    scheduler = "),
    "optimizer a parameter": lambda s: s.replace("    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n", "").replace(
        "def evaluate(args):", "def evaluate(args, optimizer=None):"),
    "optimizer handed back": lambda s: s.replace("return model, outputs", "return optimizer, outputs"),
    "level may be O2": lambda s: s.replace('amp_opt_level = "O1" if use_mixed_precision else "O0"', 'amp_opt_level = "O1" if use_mixed_precision else "O2"'),
    "level changed after": lambda s: s.replace("    outputs = run_test(", '    amp_opt_level = "O0"\n    outputs = run_test('),
    "model run by the caller": lambda s: s.replace("    _, outputs = evaluate(args)\n", "    net, outputs = evaluate(args)\n    print(net(torch.randn(1, 8)))\n"),
    "model handed back alone": lambda s: s.replace("return model, outputs", "return model").replace("_, outputs = evaluate(args)", "_ = evaluate(args)"),
    "function handed on": lambda s: s.replace("    _, outputs = evaluate(args)\n", "    _, outputs = evaluate(args)\n    run = evaluate\n"),
    "optimizer stepped": lambda s: s.replace("    outputs = run_test(", "    model(batches[0]).sum().backward()\n    optimizer.step()\n    outputs = run_test("),
}


@pytest.mark.parametrize("kept", sorted(KEPT))
def test_an_initialize_whose_optimizer_or_model_may_be_used_elsewhere_keeps_no_region(kept):
    source = KEPT[kept](_script())
    assert source != _script()
    compile(source, "test_net.py", "exec")
    new = migrate_source(source, "test_net.py").new_source
    assert "torch.autocast(" not in new and "amp.initialize(" in new, new


def test_a_function_another_file_imports_keeps_its_model_handed_back(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "test_net.py").write_text(_script())
    (tmp_path / "bench.py").write_text("import argparse\n\nfrom test_net import evaluate\n\nmodel, _ = evaluate(argparse.Namespace(dtype='float16'))\nprint(model)\n")
    migrate_paths([tmp_path])
    assert "amp.initialize(" in (tmp_path / "test_net.py").read_text()
    # nothing handed back: the function's own lines are all apex's casts reached
    (tmp_path / "test_net.py").write_text(_script(returned="nothing"))
    (tmp_path / "bench.py").write_text("import argparse\n\nfrom test_net import evaluate\n\nevaluate(argparse.Namespace(dtype='float16'))\n")
    migrate_paths([tmp_path])
    assert "torch.autocast(" in (tmp_path / "test_net.py").read_text()
