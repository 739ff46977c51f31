"""``python -m ampshim compare [options] ORIGINAL MIGRATED [-- ARGS...]``.

ORIGINAL and MIGRATED are each a script's path or ``-m MODULE``. Exit status: 0 the two train the
same, 1 they differ, 2 one could not run (or the command line is wrong).
"""
from __future__ import annotations

import argparse
import os
import sys

__all__ = ["main"]

_MODULE = "\0module:"  # a module target, set apart from paths before argparse sees the line

_DESCRIPTION = """\
Run an apex script (on ampshim) and its migration (on native torch.amp, apex unavailable) with
the same arguments and seed, record every optimizer step of both, and say whether they train the
same or where they part. ORIGINAL and MIGRATED are each a script's path or -m MODULE; the
scripts' own arguments go after --.

exit status: 0 same, 1 differs, 2 could not run"""

_EPILOG = """\
example:
  python -m ampshim compare --device cpu train.py migrated/train.py -- --epochs 1"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ampshim compare", description=_DESCRIPTION, epilog=_EPILOG,
        usage="%(prog)s [options] ORIGINAL MIGRATED [-- ARGS...]",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("original", metavar="ORIGINAL",
                        help="the apex script's path, or -m MODULE")
    parser.add_argument("migrated", metavar="MIGRATED",
                        help="its migration's path, or -m MODULE")
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        help="cpu: run scripts written for CUDA on the CPU (float16 as bfloat16)")
    parser.add_argument("--steps", type=_positive_int, default=20,
                        help="optimizer steps to run and compare (default: %(default)s)")
    parser.add_argument("--rtol", type=float,
                        help="relative tolerance on losses (default: 0.02 bfloat16, 0.005 "
                             "float16, 1e-4 float32)")
    parser.add_argument("--seed", type=int, default=0, help="seed of both runs (default: 0)")
    parser.add_argument("--output-format", choices=("text", "json"), default="text")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="draw both loss curves, skipped steps marked (needs matplotlib)")
    parser.add_argument("--allow-apex", action="store_true",
                        help="serve apex to the migrated script too (a partial migration)")
    parser.add_argument("--nproc-per-node", type=_positive_int, default=1, metavar="N",
                        help="launch N ranks of each script with torchrun (default: 1)")
    parser.add_argument("--parallel", action="store_true",
                        help="run the two scripts at the same time (CPU runs on a free machine)")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="stop a script that runs longer than this")
    parser.add_argument("--record-dir", metavar="DIR",
                        help="keep each side's records and output in DIR/original, DIR/migrated")
    parser.add_argument("--original-cwd", metavar="DIR", help="working directory of the original")
    parser.add_argument("--migrated-cwd", metavar="DIR",
                        help="working directory of the migrated script")
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """The options and targets, with ``-m MODULE`` as one token; the scripts' arguments."""
    if "--" in argv:
        cut = argv.index("--")
        head, script_args = argv[:cut], argv[cut + 1:]
    else:
        head, script_args = argv, []
    tokens, index = [], 0
    while index < len(head):
        if head[index] == "-m" and index + 1 < len(head):
            tokens.append(_MODULE + head[index + 1])
            index += 2
        else:
            tokens.append(head[index])
            index += 1
    return tokens, script_args


def main(argv: list[str]) -> int:
    from ampshim.compare.comparison import compare
    from ampshim.compare.runner import Target

    tokens, script_args = _split(argv)
    parser = _parser()
    options, unknown = parser.parse_known_args(tokens)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (the scripts' own arguments "
                     "go after --)")
    targets = []
    for text, cwd in ((options.original, options.original_cwd),
                      (options.migrated, options.migrated_cwd)):
        if text.startswith(_MODULE):
            targets.append(Target(module=text[len(_MODULE):], cwd=cwd))
        else:
            targets.append(Target(path=text, cwd=cwd))
    for target in targets:
        if target.path is not None and not _exists(target):
            print(f"ampshim compare: can't open file {target.path!r}: no such file",
                  file=sys.stderr)
            return 2
    result = compare(*targets, script_args, steps=options.steps, seed=options.seed,
                     device=options.device, rtol=options.rtol, allow_apex=options.allow_apex,
                     nproc_per_node=options.nproc_per_node, parallel=options.parallel,
                     record_dir=options.record_dir, timeout=options.timeout)
    from ampshim.compare import report

    print(report.as_json(result) if options.output_format == "json" else report.as_text(result))
    if options.plot:
        from ampshim.compare.plot import MissingMatplotlib, plot

        try:
            plot(result, options.plot)
        except MissingMatplotlib as missing:
            print(f"ampshim compare: {missing}", file=sys.stderr)
            return max(result.exit_code, 2)
    return result.exit_code


def _exists(target) -> bool:
    return os.path.exists(os.path.join(target.cwd or ".", target.path))
