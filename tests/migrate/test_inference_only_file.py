"""A file that only readies a model for inference (``model = amp.initialize(model, opt_level=args.level)``,
no optimizer, no ``amp.scale_loss`` anywhere): its reasons and fix speak of inference, not of a
loss scaled in another file or a scaler made elsewhere."""
import pytest

from migrate.api import migrate_source

SOURCE = '''\
import torch
{import_line}


def main(args, model):
    if args.fp16:
{guarded_import}        model = amp.initialize(model, opt_level={level})
    with torch.no_grad():
        return model(torch.zeros(1, 4))
'''


@pytest.mark.parametrize("level", ["args.level", '"O1"', "level_of(args)"])
@pytest.mark.parametrize("imported", ["module", "function"])
def test_an_inference_only_file_is_told_about_inference(level, imported):
    source = SOURCE.format(import_line="from apex import amp" if imported == "module" else "",
                           guarded_import="        from apex import amp\n" if imported == "function" else "", level=level)
    result = migrate_source(source, "rank.py", unsafe_fixes=True)
    said = " ".join(d.message + " " + (d.fix.message + " " + d.fix.why_unsafe if d.fix else "")
                    for d in result.diagnostics)
    assert "scale_loss" not in said and "created once, elsewhere" not in said, said
    assert "amp.initialize" not in result.new_source and "torch.autocast" in result.new_source, result.new_source
