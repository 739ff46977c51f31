"""Generated apex training scripts: shape features real code has, each spelled several ways.

``features()`` draws one combination (a Hypothesis strategy); ``script(features)`` writes the
apex O1 script with those features, written for CUDA (run it with ``--device cpu`` on the CPU).
Every script trains a small regression on synthetic data from a fixed seed for ``ITERATIONS``
micro-batches, so ``python -m ampshim compare`` can hold its rewrites to it.
"""
from __future__ import annotations

import textwrap
from dataclasses import asdict, dataclass

from hypothesis import strategies as st

ITERATIONS = 16


@dataclass(frozen=True)
class Features:
    loss: str  # inline | helper | arms (assigned in both arms of an if after the model call)
    loop: str  # range | while | enumerate
    accumulation: str  # none | delay_unscale | plain (scaled backward each micro-batch, no delay)
    boundary: str  # how the accumulation boundary is spelled: plus_one | minus_one
    clip: str  # none | master_params | parameters
    clip_at: str  # with accumulation: boundary (before the step) | micro_batch (after each backward)
    flag: str  # none | on | off: initialize and the scaled backward under `if args.fp16:`
    #            (a plain backward else), the flag on or off by default
    import_guard: bool  # `try: from apex import amp` beside a has_apex flag the guard also tests
    inner_fp32: bool  # the model's head runs under its own autocast(enabled=False)
    names: tuple[str, str, str]  # model, optimizer, loss

    def label(self) -> str:
        return ", ".join(f"{key}={value}" for key, value in asdict(self).items() if key != "names")


NAMES = st.tuples(st.sampled_from(["model", "net", "network"]),
                  st.sampled_from(["optimizer", "opt", "optim"]),
                  st.sampled_from(["loss", "train_loss", "objective"]))


def features():
    return st.builds(
        Features,
        loss=st.sampled_from(["inline", "helper", "arms"]),
        loop=st.sampled_from(["range", "while", "enumerate"]),
        accumulation=st.sampled_from(["none", "delay_unscale", "plain"]),
        boundary=st.sampled_from(["plus_one", "minus_one"]),
        clip=st.sampled_from(["none", "master_params", "parameters"]),
        clip_at=st.sampled_from(["boundary", "micro_batch"]),
        flag=st.sampled_from(["none", "on", "off"]),
        import_guard=st.booleans(),
        inner_fp32=st.booleans(),
        names=NAMES,
    )


_HELPER = '''
def compute_loss(model, inputs, targets):
    return F.mse_loss(model(inputs), targets)
'''

_NET = '''
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.Tanh())
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        hidden = self.body(x)
        with torch.autocast("cuda", enabled=False):
            return self.head(hidden.float())
'''


def script(f: Features) -> str:
    model, optimizer, loss = f.names
    accumulate = f.accumulation != "none"
    steps = 2 if accumulate else 1
    body = []
    if f.loss == "inline":
        body.append(f"{loss} = F.mse_loss({model}(x), y)")
    elif f.loss == "helper":
        body.append(f"{loss} = compute_loss({model}, x, y)")
    else:
        body += [f"output = {model}(x)",
                 "if step % 2 == 0:",
                 f"    {loss} = F.mse_loss(output, y)",
                 "else:",
                 f"    {loss} = F.smooth_l1_loss(output, y)"]
    if accumulate:
        body.append(f"{loss} = {loss} / ACCUMULATION")
        body.append("boundary = " + ("(step + 1) % ACCUMULATION == 0" if f.boundary == "plus_one"
                                     else "step % ACCUMULATION == ACCUMULATION - 1"))
    delay = ", delay_unscale=not boundary" if f.accumulation == "delay_unscale" else ""
    scaled = [f"with amp.scale_loss({loss}, {optimizer}{delay}) as scaled_loss:",
              "    scaled_loss.backward()"]
    mixed = "use_amp" if f.flag != "none" else None
    if mixed:
        body += [f"if {mixed}:", *("    " + line for line in scaled), "else:",
                 f"    {loss}.backward()"]
    else:
        body += scaled
    clip = []
    if f.clip == "master_params":
        clip.append(f"torch.nn.utils.clip_grad_norm_(amp.master_params({optimizer}), 0.5)")
    elif f.clip == "parameters":
        clip.append(f"torch.nn.utils.clip_grad_norm_({model}.parameters(), 0.5)")
    update = [] if accumulate and f.clip_at == "micro_batch" else clip
    body += clip if accumulate and f.clip_at == "micro_batch" else []
    update += [f"{optimizer}.step()", f"{optimizer}.zero_grad()"]
    if accumulate:
        body += ["if boundary:", *("    " + line for line in update)]
    else:
        body += update
    body.append(f"losses.append(float({loss}))")

    if f.loop == "range":
        loop = [f"for step in range({ITERATIONS}):", "    x, y = batches[step % len(batches)]"]
        loop += ["    " + line for line in body]
    elif f.loop == "while":
        loop = ["step = 0", f"while step < {ITERATIONS}:", "    x, y = batches[step % len(batches)]"]
        loop += ["    " + line for line in body] + ["    step += 1"]
    else:
        loop = [f"for step, (x, y) in enumerate(batches * {ITERATIONS // 4}):"]
        loop += ["    " + line for line in body]

    initialize = (f"{model}, {optimizer} = amp.initialize({model}, {optimizer}, "
                  'opt_level="O1", verbosity=0)')
    flag = []
    if mixed:
        initialize = f"if {mixed}:\n    " + initialize
        flag = ['parser.add_argument("--no-fp16", dest="fp16", action="store_false")'
                if f.flag == "on" else 'parser.add_argument("--fp16", action="store_true")']
    guard = "has_apex and args.fp16" if f.import_guard else "args.fp16"
    network = "Net()" if f.inner_fp32 else "nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))"
    main = "\n".join([
        "parser = argparse.ArgumentParser()",
        *flag,
        "args = parser.parse_args()",
        *([f"{mixed} = {guard}"] if mixed else []),
        "torch.manual_seed(0)",
        f"{model} = {network}.cuda()",
        f"{optimizer} = torch.optim.SGD({model}.parameters(), lr=0.1)",
        initialize,
        'data = torch.randn(64, 16, device="cuda")',
        "target = data[:, :1].sin() * 3",
        "batches = [(data[i:i + 16], target[i:i + 16]) for i in range(0, 64, 16)]",
        "losses = []",
        *loop,
        "print(losses[-1])",
    ])
    header = f'"""A generated apex script: {f.label()}."""\n'
    imports = ("import argparse\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n")
    if f.import_guard:
        imports += ("\ntry:\n    from apex import amp\n    has_apex = True\nexcept ImportError:\n"
                    "    has_apex = False\n")
    else:
        imports += "from apex import amp\n"
    constants = f"\nACCUMULATION = {steps}\n" if accumulate else ""
    helper = (_HELPER if f.loss == "helper" else "") + (_NET if f.inner_fp32 else "")
    return (header + imports + constants + helper + "\n\ndef main():\n"
            + textwrap.indent(main, "    ") + '\n\n\nif __name__ == "__main__":\n    main()\n')
