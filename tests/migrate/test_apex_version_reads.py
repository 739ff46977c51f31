"""apex's version read in a log line (``amp.__version__``, ``apex.amp.__version__.VERSION``,
``amp.__file__``): the line goes with apex, and an ``if`` that held only it goes too. Where the
line stays, ``from apex.amp import __version__``, the import that makes ``apex.amp.__version__``
reachable, is not an unused import."""
import itertools
import textwrap

import pytest

from migrate.api import migrate_source

TRAINER = '''\
import torch
{imports}


def setup(args, model, optimizer):
{guarded}
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    return model, optimizer


def train(model, optimizer, batches):
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
'''
READS = {
    "amp.__version__": ("from apex import amp", "amp.__version__"),
    "amp.__version__.VERSION": ("from apex import amp", "'.'.join(map(str, amp.__version__.VERSION))"),
    "apex.amp.__version__.VERSION": ("import apex\nfrom apex.amp import __version__\nfrom apex import amp",
                                     "'.'.join(str(i) for i in apex.amp.__version__.VERSION)"),
    "amp.__file__": ("from apex import amp", "amp.__file__"),
}
LOGGERS = {"print": "print('apex {{}}'.format({read}))", "logging": "logging.info('apex %s', {read})"}
GUARDS = {"none": "{line}", "flag": "if args.verbose:\n    {line}", "two tests": "if args.verbose and args.rank == 0:\n    {line}"}


def trainer(read: str, logger: str, guard: str) -> str:
    imports, value = READS[read]
    line = LOGGERS[logger].format(read=value)
    guarded = textwrap.indent(GUARDS[guard].format(line=line), "    ")
    return TRAINER.format(imports=("import logging\n" if logger == "logging" else "") + imports, guarded=guarded)


@pytest.mark.parametrize("read,logger,guard", list(itertools.product(READS, LOGGERS, GUARDS)))
def test_a_log_line_naming_apex_goes_with_it_and_so_does_an_if_left_empty(read, logger, guard):
    source = trainer(read, logger, guard)
    result = migrate_source(source, filename="train.py")
    fixed = result.new_source
    assert result.error is None and "apex" not in fixed and "amp.initialize" not in fixed, fixed
    assert "args.verbose" not in fixed and "pass" not in fixed, fixed
    assert "scaler.scale(loss).backward()" in fixed, fixed
    compile(fixed, "train.py", "exec")


def test_the_submodule_import_a_dotted_read_reaches_is_kept():
    source = textwrap.dedent('''\
        import apex
        from apex.amp import __version__
        from apex.contrib.sparsity import ASP


        def report():
            print("apex", apex.amp.__version__.VERSION)
            return ASP
        ''')
    result = migrate_source(source, filename="info.py")
    assert "from apex.amp import __version__" in (result.new_source or source), result.new_source
    assert not any(d.code == "AMP001" and "__version__" in d.message for d in result.diagnostics), result.diagnostics
