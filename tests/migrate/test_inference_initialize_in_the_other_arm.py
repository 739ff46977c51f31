"""A script that readies its model for training in one arm and for inference in the other
(``if args.do_train: ... amp.initialize(model, optimizer, ...)`` / ``else: model =
amp.initialize(model, ...)``), then trains or predicts in the arms of a later ``if`` on the same
test (``if args.do_train: <train> elif args.do_predict: predict(model)``). The inference call was
left for the unsafe hand-off, and with it the whole file: the arms of the later ``if`` that run on
its way now go under autocast, each a region, enabled by its flag and level (a computed level
stops O2/O3 at run time, as the training call's does). Generated over the arm holding the
inference call, the later chain's shape, the lines between, the level and the pass; the
negatives are the shapes where the model may run outside those arms or the test may change."""
from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from migrate.api import migrate_source

from generated.inference_runs import printed_alike

SCRIPT = """import argparse
import logging

import torch

logger = logging.getLogger(__name__)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.proj(x)

    def score(self, x):
        return self.proj(x) * 2


def predict(model, batches):
    model.eval()
    with torch.no_grad():
        outputs = [model(b) for b in batches]
    return [str(o.dtype) for o in outputs], [round(float(o.float().sum()), 2) for o in outputs]


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--fp16_opt_level", default="O1"{choices})
    parser.add_argument("--do_train", action="store_true")
    parser.add_argument("--do_predict", action="store_true")
    parser.add_argument("--do_test", action="store_true")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = Net()
    batches = [torch.randn(4, 8) for _ in range(3)]
{readies}
{between}
{chain}


if __name__ == "__main__":
    main()
"""
TRAIN_ARM = """optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if args.fp16:
    from apex import amp
    model, optimizer = amp.initialize(model, optimizer, opt_level={level})
"""
INFER_ARM = """if args.fp16:
    from apex import amp
    model = amp.initialize(model, opt_level={level})
"""
TRAIN = """for batch in batches:
    loss = model(batch).pow(2).mean()
    if args.fp16:
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
    else:
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print("out", [round(float(p.sum()), 4) for p in model.parameters()])
"""
# the pass made on the inference way, and how it prints
PASSES = {
    "helper": 'print("out", predict(model, batches))\n',
    "method": 'with torch.no_grad():\n    scores = [model.score(b) for b in batches]\nprint("out", [str(s.dtype) for s in scores])\n',
    "inline": 'model.eval()\nwith torch.no_grad():\n    out = model(batches[0])\nlogger.info("done")\nprint("out", str(out.dtype), round(float(out.float().sum()), 2))\n',
}
LEVELS = {  # the level argument, argparse's choices
    "literal": ('"O1"', ""),
    "computed": ("args.fp16_opt_level", ""),
    "choices": ("args.fp16_opt_level", ', choices=["O0", "O1"]'),
}
BETWEEN = {
    "nothing": "",
    "parallel wrappers": "if torch.cuda.device_count() > 1:\n    model = torch.nn.DataParallel(model)\nmodel.to('cpu')\n",
    "a report": "logger.info('model ready: %s', str(args.do_train))\n",
}


def _indented(lines: str) -> str:
    return "".join(f"    {line}\n" if line else "\n" for line in lines.splitlines())


def _script(arm="else", chain="elif", between="nothing", level="literal", pass_="helper") -> str:
    argument, choices = LEVELS[level]
    train, infer = _indented(TRAIN_ARM.format(level=argument)), _indented(INFER_ARM.format(level=argument))
    if arm == "else":
        readies = f"if args.do_train:\n{train}else:\n{infer}"
    else:  # the inference arm first, under the test's negation
        readies = f"if not args.do_train:\n{infer}else:\n{train}"
    run, step = _indented(PASSES[pass_]), _indented(TRAIN)
    test = "args.do_train" if arm == "else" else "not args.do_train"
    if arm == "else":
        chains = {
            "elif": f"if {test}:\n{step}elif args.do_predict:\n{run}",
            "else": f"if {test}:\n{step}else:\n{run}",
            "two elifs": f"if {test}:\n{step}elif args.do_predict:\n{run}elif args.do_test:\n{run}",
        }
    else:
        chains = {
            "elif": f"if {test}:\n{run}elif args.do_predict:\n{step}",
            "else": f"if {test}:\n{run}else:\n{step}",
            "two elifs": f"if {test}:\n{run}elif args.do_predict:\n{step}elif args.do_test:\n{step}",
        }
    return SCRIPT.format(choices=choices, readies=_indented(readies).rstrip("\n"), between=_indented(BETWEEN[between]).rstrip("\n"),
                         chain=_indented(chains[chain]).rstrip("\n"))


VARIANTS = [
    (arm, chain, between, level, pass_)
    for (arm, chain, level), between, pass_ in zip(itertools.product(["else", "body"], ["elif", "else", "two elifs"], LEVELS),
                                                  itertools.cycle(BETWEEN), itertools.cycle(PASSES))
]


@pytest.mark.parametrize("arm, chain, between, level, pass_", VARIANTS)
def test_the_arms_run_on_the_inference_way_go_under_autocast(arm, chain, between, level, pass_):
    source = _script(arm, chain, between, level, pass_)
    compile(source, "train.py", "exec")
    result = migrate_source(source, "train.py")
    new = result.new_source
    assert "import apex" not in new and "from apex import" not in new and "amp.initialize" not in new, new
    assert all(d.fix is None or not d.fix.why_unsafe for d in result.diagnostics), new
    # each arm run on the inference way holds one region; the training arm keeps its own
    regions = new.count("enabled=args.fp16") - new.count("GradScaler")
    runs = 2 if chain == "two elifs" and arm == "else" else 1
    assert regions >= runs, new
    checks = new.count("raise RuntimeError(")
    assert checks == (2 if level == "computed" else 0), new  # both ways stop O2/O3
    compile(new, "train.py", "exec")


ARGVS = {
    "predict, fp16": ["--fp16", "--do_predict", "--do_test"],
    "predict, fp32": ["--do_predict", "--do_test"],
    "train, fp16": ["--fp16", "--do_train"],
}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("variant", [VARIANTS[0], VARIANTS[4], pytest.param(VARIANTS[8], marks=pytest.mark.slow),
                                     pytest.param(VARIANTS[10], marks=pytest.mark.slow)])
@pytest.mark.parametrize("argv", sorted(ARGVS))
def test_the_migrated_script_predicts_and_trains_as_apex_did(tmp_path, variant, argv):
    """The original on ampshim and its rewrite print the same, predicting or training, with mixed
    precision on and off."""
    expected = printed_alike(tmp_path, _script(*variant), "train.py", ARGVS[argv])
    if "--do_predict" in ARGVS[argv]:
        assert ("bfloat16" in expected) == ("--fp16" in ARGVS[argv]), expected


# where the model may run outside the arms on the inference way, or the test may change: the
# call keeps its unsafe hand-off
KEPT = {
    "another test": lambda s: s.replace("    if args.do_train:\n        for batch", "    if args.do_predict and not args.do_train:\n        for batch"),
    "the test changed between": lambda s: s.replace("    if torch.cuda.device_count() > 1:", "    args.do_train = True\n    if torch.cuda.device_count() > 1:"),
    "a pass between": lambda s: s.replace("    if torch.cuda.device_count() > 1:", "    print(model(batches[0]))\n    if torch.cuda.device_count() > 1:"),
    "a pass after": lambda s: s.replace('\n\n\nif __name__ == "__main__":', '\n    print("out", predict(model, batches))\n\n\nif __name__ == "__main__":'),
    "a library's trainer made from it": lambda s: s.replace('    elif args.do_predict:\n        print("out", predict(model, batches))',
                                                             '    elif args.do_predict:\n        Trainer(model).fit()'),
    "a library's trainer held, then run": lambda s: s.replace('    elif args.do_predict:\n        print("out", predict(model, batches))',
                                                               '    elif args.do_predict:\n        bot = Trainer(model)\n        bot.train()'),
    "a computation between": lambda s: s.replace("    if torch.cuda.device_count() > 1:", "    probe = torch.randn(2, 2) @ torch.randn(2, 2)\n    if torch.cuda.device_count() > 1:"),
    "an elif test that computes": lambda s: s.replace("    elif args.do_predict:", "    elif should_predict(args):"),
    "the model handed back": lambda s: s.replace('\n\n\nif __name__ == "__main__":', '\n    return model\n\n\nif __name__ == "__main__":'),
}


@pytest.mark.parametrize("kept", sorted(KEPT))
def test_an_inference_way_whose_model_may_run_elsewhere_stays_unsafe(kept):
    source = KEPT[kept](_script(between="parallel wrappers"))
    assert source != _script(between="parallel wrappers"), kept
    compile(source, "train.py", "exec")
    result = migrate_source(source, "train.py")
    assert "amp.initialize(model, opt_level" in result.new_source, result.new_source


@pytest.mark.filterwarnings("ignore")
def test_a_level_known_at_run_time_stops_o2_on_the_inference_way(tmp_path):
    """``opt_level=args.fp16_opt_level`` (default O1, any value): the inference way gets the
    training call's check, so a run at O2, which the rewrite would not reproduce, stops."""
    source = _script(level="computed")
    migrated = tmp_path / "train.py"
    migrated.write_text(migrate_source(source, "train.py").new_source)
    done = subprocess.run([sys.executable, str(migrated), "--fp16", "--do_predict", "--fp16_opt_level", "O2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "native torch.amp has no O2/O3" in done.stderr, done.stderr
    done = subprocess.run([sys.executable, str(migrated), "--do_predict", "--fp16_opt_level", "O2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "out" in done.stdout, done.stderr  # mixed precision off: nothing to stop
