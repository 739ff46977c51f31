"""Every name a generated script's function reads is bound somewhere it can reach: in the
function, at module level (also through ``global``), or a builtin. A generated script that
raises NameError judges nothing; one did, where ``amp_setup=method`` moved ``__init__``'s test
of its ``use_amp`` parameter into the set-up method after apex's import lines."""
from __future__ import annotations

import builtins
import itertools
import subprocess
import symtable
import sys

import pytest

from generated.apex_scripts import Features, script


def _module_bindings(table: symtable.SymbolTable) -> set[str]:
    """Names bound at module level, or in a function that declares them ``global``."""
    bound = set()
    for symbol in table.get_symbols():
        declared = table.get_type() != "module" and symbol.is_declared_global()
        if (table.get_type() == "module" or declared) and (symbol.is_assigned() or symbol.is_imported()):
            bound.add(symbol.get_name())
    for child in table.get_children():
        bound |= _module_bindings(child)
    return bound


def unbound_reads(source: str) -> list[tuple[str, str]]:
    """``(function, name)`` for each global a function reads that nothing binds."""
    top = symtable.symtable(source, "<generated>", "exec")
    module = _module_bindings(top)
    missing = []

    def walk(table: symtable.SymbolTable) -> None:
        for symbol in table.get_symbols():
            name = symbol.get_name()
            if (table.get_type() != "module" and symbol.is_global() and symbol.is_referenced()
                    and name not in module and not hasattr(builtins, name)):
                missing.append((table.get_name(), name))
        for child in table.get_children():
            walk(child)

    walk(top)
    return missing


def test_the_check_finds_a_read_of_another_functions_parameter():
    assert unbound_reads("def f(flag):\n    pass\n\ndef g():\n    return flag\n") == [("g", "flag")]
    assert unbound_reads("def f():\n    global amp\n    amp = 1\n\ndef g():\n    return amp\n") == []


SET_UP = list(itertools.product(["on", "off", "none"], ["module", "function", "global_first", "guarded"],
                                [False, True], ["class", "base"], ["init", "method"]))


@pytest.mark.parametrize("flag, import_in, flag_copy, methods_in, amp_setup", SET_UP)
def test_a_trainers_set_up_reads_only_names_it_can_reach(flag, import_in, flag_copy, methods_in, amp_setup):
    drawn = Features(loss="inline", loop="range", accumulation="none", boundary="plus_one", clip="parameters",
                     clip_at="boundary", flag=flag, import_guard=False, inner_fp32=False,
                     names=("model", "optimizer", "loss"), holder="method", backward_in="helper",
                     import_in=import_in, flag_copy=flag_copy, methods_in=methods_in, amp_setup=amp_setup)
    assert unbound_reads(script(drawn)) == []


@pytest.mark.slow  # runs each script
@pytest.mark.parametrize("import_in, amp_via, clip", [
    *itertools.product(["function", "global_first", "guarded"], ["module", "attribute", "parameter"], ["parameters"]),
    *itertools.product(["function", "global_first"], ["module", "attribute"], ["master_params"])])
def test_a_set_up_method_that_never_ran_leaves_nothing_read_unbound(import_in, amp_via, clip, tmp_path):
    """With the flag off the set-up method never runs, so apex's import in it never binds ``amp``:
    a script handing ``amp`` to its loop, or clipping ``amp.master_params``, raised NameError on
    ampshim (bench, seed 1000)."""
    drawn = Features(loss="helper", loop="while", accumulation="inner_loop", boundary="plus_one", clip=clip,
                     clip_at="boundary", flag="off", import_guard=False, inner_fp32=False,
                     names=("network", "opt", "loss"), holder="method", backward_in="scaled_method",
                     import_in=import_in, amp_via=amp_via, amp_setup="method", checkpoint=True)
    path = tmp_path / "train.py"
    path.write_text(script(drawn))
    ran = subprocess.run([sys.executable, "-m", "ampshim", "--device", "cpu", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
