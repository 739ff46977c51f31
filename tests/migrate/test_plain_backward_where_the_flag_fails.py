"""In a file that does not initialize apex (a framework's train step; the runner initializes), a
plain backward pass in the arm where apex's flag fails (``else:`` of ``if loss_scaler: ...
elif use_apex_amp:``) never runs in a pass with a scaled backward under a later ``elif
use_apex_amp:`` of the same test: it is no reason the rewrite is unsafe, however the chain is
ordered. Where the later scaled backward is not under that test, it is."""
from __future__ import annotations

import pytest

from migrate.api import migrate_source

CHAINS = {
    "native_first": ("if loss_scaler:\n{i}    loss_scaler.scale({loss}).backward()\n{i}elif use_apex_amp:\n{i}    {scaled}\n"
                     "{i}else:\n{i}    {loss}.backward()"),
    "apex_first": "if use_apex_amp:\n{i}    {scaled}\n{i}else:\n{i}    {loss}.backward()",
    "negated": "if not use_apex_amp:\n{i}    {loss}.backward()\n{i}else:\n{i}    {scaled}",
}


def _scaled(loss: str, optimizer: str, indent: str) -> str:
    return f"with amp.scale_loss({loss}, {optimizer}) as scaled:\n{indent}        scaled.backward()"


def _gan(chain: str, generator_guarded: bool = True) -> str:
    i = "    "
    disc = CHAINS[chain].format(i=i, loss="loss_d", scaled=_scaled("loss_d", "opt_d", i))
    gen = CHAINS[chain].format(i=i, loss="loss_g", scaled=_scaled("loss_g", "opt_g", i))
    if not generator_guarded:
        gen = _scaled("loss_g", "opt_g", i)
    return (
        "import torch\nfrom apex import amp\n\n\n"
        "def train_step(disc, gen, x, opt_d, opt_g, loss_scaler=None, use_apex_amp=False):\n"
        "    loss_d = disc(gen(x).detach()).mean()\n"
        f"    {disc}\n"
        "    opt_d.step()\n"
        "    loss_g = -disc(gen(x)).mean()\n"
        f"    {gen}\n"
        "    opt_g.step()\n"
    )


def _reasons(source: str) -> str:
    result = migrate_source(source, "gan.py", unsafe_fixes=True)
    assert result.error is None, result.error
    return " ".join(d.fix.why_unsafe or "" for d in result.diagnostics if d.fix)


@pytest.mark.parametrize("chain", list(CHAINS))
def test_a_plain_backward_where_apex_is_off_is_no_reason(chain):
    assert "plain backward pass" not in _reasons(_gan(chain))


@pytest.mark.parametrize("chain", list(CHAINS))
def test_a_plain_backward_before_a_scaled_one_on_every_pass_is_a_reason(chain):
    assert "plain backward pass `" in _reasons(_gan(chain, generator_guarded=False))
