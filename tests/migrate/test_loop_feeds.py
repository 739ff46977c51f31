"""A method running an O1 model whose result the loop hands back to the training.

A reinforcement-learning agent keeps its actor on ``self`` through ``amp.initialize`` and scales its
loss in ``train``; ``select_action`` runs ``self.actor(state)``, and the loop stores what it returns
and hands it to ``agent.train``. apex O1 cast torch's functions process-wide, so the actions were
computed in float16; the native rewrite ran ``select_action`` in float32 outside every autocast,
and the agent trained on other data. Where the method is the agent's own, its run of the model goes
under autocast, enabled as the training region (the method's ``self`` holds the scaler); where it is
a base class's (which other subclasses share, without a scaler), in this file or another, the
rewrite is unsafe and marked. A result the loop only prints, or a method run outside the training
loop (an evaluation), is left as it was.
"""
from __future__ import annotations

import itertools
import shutil
import textwrap

import pytest
from rewrite_runs import compare_with_its_rewrite

from migrate.api import migrate_paths

pytestmark = pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")

AGENT = '''import torch
from apex import amp
{import_base}

{base}class Agent({parent}):
    def __init__(self, use_amp):
        torch.manual_seed(0)
        self.actor = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).cuda()
        self.optimizer = torch.optim.SGD(self.actor.parameters(), lr=0.05)
        if use_amp:
            self.actor, self.optimizer = amp.initialize(self.actor, self.optimizer, opt_level="O1", verbosity=0)
{own}
    def train(self, states, actions):
        target = torch.sin(actions.float() * 300.0)
        loss = torch.nn.functional.mse_loss(self.actor(states).float(), target)
        self.optimizer.zero_grad()
        with amp.scale_loss(loss, self.optimizer) as scaled_loss:
            scaled_loss.backward()
        self.optimizer.step()
        return loss.item()
{driver}'''

# how the method runs the model
RUNS = {
    "called": "with torch.no_grad():\n    return self.actor(state)",
    "forward": "return self.actor.forward(state).detach()",
    "rows": "rows = []\nfor row in state:\n    rows.append(self.actor(row[None]).detach())\nreturn torch.cat(rows)",
}
# how what it returns reaches the training: `{act}` is the call, `{train}` the training call's receiver
FLOWS = {
    "direct": "action = {act}\nprint('loss', step, round({train}.train(state, action), 4))",
    "appended": "buffer.append((state, {act}))\nstates, actions = buffer[-1]\nprint('loss', step, round({train}.train(states, actions), 4))",
    "zipped": ("actions = {act}\nfor one_state, one_action in zip(state, actions):\n    buffer.append((one_state, one_action))\n"
               "states = torch.stack([s for s, _ in buffer[-8:]])\nacts = torch.stack([a for _, a in buffer[-8:]])\n"
               "print('loss', step, round({train}.train(states, acts), 4))"),
    "noised": "action = ({act} + 0.0 * torch.randn(8, 2).cuda()).clamp(-1, 1)\nloss = {train}.train(state, action)\nprint('loss', step, round(loss, 4))",
}
# where the method is defined
PLACES = ("own", "base", "base_file")
# where the loop runs, and how
DRIVERS = ("module", "function", "method")
LOOPS = ("for", "while", "nested")


def _indent(text: str, spaces: int) -> str:
    return textwrap.indent(text, " " * spaces)


def _driver(flow: str, driver: str, loop_kind: str) -> str:
    receiver = "self" if driver == "method" else "agent"
    body = FLOWS[flow].format(act=f"{receiver}.select_action(state)", train=receiver) + "\nstate = torch.randn(8, 4).cuda()"
    loop = "for step in range(6):\n" + _indent(body, 4)
    if loop_kind == "nested":
        loop = "for episode in range(2):\n" + _indent(loop.replace("range(6)", "range(3)"), 4)
    elif loop_kind == "while":
        loop = "step = 0\nwhile step < 6:\n" + _indent(body + "\nstep += 1", 4)
    setup = "buffer = []\nstate = torch.randn(8, 4).cuda()\n"
    if driver == "module":
        return "\n\nagent = Agent(True)\n" + setup + loop + "\n"
    if driver == "function":
        return "\n\ndef main():\n" + _indent("agent = Agent(True)\n" + setup + loop, 4) + "\n\n\nmain()\n"
    return ("\n    def run(self):\n" + _indent(setup + loop, 8) + "\n\n\nAgent(True).run()\n")


def _method(run: str) -> str:
    return "\n    def select_action(self, state):\n" + _indent(RUNS[run], 8) + "\n"


def project(tmp_path, run: str, flow: str, place: str, driver: str, loop_kind: str = "for"):
    """The agent's file (and its base's, for ``base_file``) in ``tmp_path``; the agent's path."""
    base = "class Base:\n" + _method(run) + "\n\n" if place == "base" else ""
    text = AGENT.format(import_base="from base import Base\n" if place == "base_file" else "", base=base,
                        parent="Base" if place != "own" else "", own=_method(run) if place == "own" else "",
                        driver=_driver(flow, driver, loop_kind))
    text = text.replace("class Agent():", "class Agent:")
    if place == "base_file":
        (tmp_path / "base.py").write_text("import torch\n\n\nclass Base:\n" + _method(run))
    (tmp_path / "train.py").write_text(text)
    compile(text, "train.py", "exec")
    return tmp_path / "train.py"


def _migrated(tmp_path, path, unsafe: bool) -> str:
    copy = tmp_path / ("unsafe" if unsafe else "safe")
    shutil.copytree(path.parent, copy)
    migrate_paths([copy], unsafe_fixes=unsafe)
    return (copy / path.name).read_text()


def _run_line(new: str, run: str) -> int:
    wanted = {"called": "return self.actor(state)", "forward": "return self.actor.forward(state).detach()",
              "rows": "rows.append(self.actor(row[None]).detach())"}[run]
    return next(index for index, line in enumerate(new.splitlines()) if line.strip() == wanted)


def _under_autocast(new: str, at: int) -> bool:
    lines = new.splitlines()
    indent = len(lines[at]) - len(lines[at].lstrip())
    for line in reversed(lines[:at]):
        own = len(line) - len(line.lstrip())
        if line.strip() and own < indent:
            if line.strip().startswith("def "):
                return False
            if line.strip() == 'with torch.autocast("cuda", dtype=torch.float16, enabled=self.scaler.is_enabled()):':
                return True
            indent = own
    return False


# each run and flow once with each place, the loop's place and kind varying with them (every pair of the two)
CASES = [(run, flow, place, DRIVERS[index % 3], LOOPS[index // 3 % 3])
         for index, (run, flow, place) in enumerate(itertools.product(sorted(RUNS), sorted(FLOWS), PLACES))]


@pytest.mark.parametrize(("run", "flow", "driver", "loop_kind"), [case[:2] + case[3:] for case in CASES if case[2] == "own"])
def test_the_agents_own_method_runs_its_model_under_autocast(tmp_path, run, flow, driver, loop_kind):
    path = project(tmp_path, run, flow, "own", driver, loop_kind)
    new = _migrated(tmp_path, path, unsafe=False)
    assert "from apex import" not in new and "TODO(ampmigrate)" not in new, new
    assert _under_autocast(new, _run_line(new, run)), new


@pytest.mark.parametrize(("run", "flow", "place", "driver", "loop_kind"), [case for case in CASES if case[2] != "own"])
def test_a_base_class_method_keeps_the_rewrite_unsafe_and_marked(tmp_path, run, flow, place, driver, loop_kind):
    """A base class may have subclasses with no scaler: its method is not wrapped, and the rewrite
    says where it parts from apex (at the run where this file holds it, else at the scaled backward)."""
    path = project(tmp_path, run, flow, place, driver, loop_kind)
    assert "from apex import" in _migrated(tmp_path, path, unsafe=False)
    new = _migrated(tmp_path, path, unsafe=True)
    assert "from apex import" not in new, new
    lines = new.splitlines()
    at = _run_line(new, run) if place == "base" else next(index for index, line in enumerate(lines) if ".scale(loss).backward()" in line)
    assert "TODO(ampmigrate)" in "\n".join(lines[max(at - 4, 0):at]) and "select_action" in "\n".join(lines[max(at - 4, 0):at]), new
    assert not _under_autocast(new, _run_line(new, run)) if place == "base" else True


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_action_only_printed_leaves_the_method_as_it_was(tmp_path, driver):
    path = project(tmp_path, "called", "direct", "own", driver)
    path.write_text(path.read_text().replace("action = agent.select_action(state)", "print(agent.select_action(state).sum())")
                    .replace("action = self.select_action(state)", "print(self.select_action(state).sum())")
                    .replace("train(state, action)", "train(state, torch.zeros(8, 2).cuda())"))
    new = _migrated(tmp_path, path, unsafe=False)
    assert "from apex import" not in new and "TODO(ampmigrate)" not in new, new
    assert not _under_autocast(new, _run_line(new, "called")), new


@pytest.mark.parametrize("place", PLACES)
def test_an_evaluation_outside_the_training_loop_leaves_the_method_as_it_was(tmp_path, place):
    path = project(tmp_path, "called", "direct", place, "function")
    path.write_text(path.read_text().replace("\n\nmain()\n", "\n\ndef evaluate(agent):\n    for _ in range(3):\n"
                                             "        print(agent.select_action(torch.randn(8, 4).cuda()).sum())\n\n\n"
                                             "main()\nevaluate(Agent(True))\n")
                    .replace("action = agent.select_action(state)", "action = torch.zeros(8, 2).cuda()"))
    new = _migrated(tmp_path, path, unsafe=False)
    assert "from apex import" not in new and "TODO(ampmigrate)" not in new, new
    assert not _under_autocast(new, _run_line(new, "called")) if place != "base_file" else True


@pytest.mark.slow
@pytest.mark.parametrize(("run", "flow", "driver"), [("called", "appended", "module"), ("rows", "zipped", "method")])
def test_the_rewrite_trains_on_the_actions_apex_computed(tmp_path, run, flow, driver):
    """The original on ampshim and its rewrite train the same on the CPU; with the method left in
    float32 (the rewrite before) the losses part at the first step."""
    from ampshim.compare import SAME
    from ampshim.compare.report import as_text

    original = tmp_path / "original"
    original.mkdir()
    project(original, run, flow, "own", driver)
    result = compare_with_its_rewrite(original, steps=6)
    assert result.verdict == SAME, as_text(result)
