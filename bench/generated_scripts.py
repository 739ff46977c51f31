"""Generated apex scripts, held to their rewrites by ``python -m ampshim compare``.

For each drawn combination of shape features (``tests/generated/apex_scripts.py``): the script
on ampshim against its safe rewrite and against its ``--unsafe-fixes`` rewrite (both on the CPU).
A safe rewrite must train the same; an unsafe one must not crash, and where it trains differently
it must carry a ``TODO(ampmigrate)`` marker. Prints each failure and the share of scripts whose
safe rewrite migrated them fully (no apex left), per feature value.

    python bench/generated_scripts.py [--count 1000] [--seed 0]
"""
from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from generated.apex_scripts import features  # noqa: E402
from generated.judge import judge  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--new-interpreters", action="store_true",
                        help="start each side as a new interpreter, not a fork of this one")
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="generated-"))
    outcomes = []

    @settings(max_examples=options.count, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(features())
    def run(drawn):
        outcome = judge(drawn, folder / f"s{len(outcomes)}", fork=not options.new_interpreters)
        outcomes.append((drawn, outcome))
        print(f"{len(outcomes):5} {outcome.summary}  [{drawn.label()}]", flush=True)

    run._hypothesis_internal_use_seed = options.seed
    run()
    shares = collections.defaultdict(lambda: [0, 0])
    for drawn, outcome in outcomes:
        for key, value in vars(drawn).items():
            if key != "names":
                shares[(key, value)][0] += outcome.safe_complete
                shares[(key, value)][1] += 1
    print(f"\n{len(outcomes)} scripts; wrong safe rewrites: "
          f"{sum(o.safe_wrong for _, o in outcomes)}; crashing unsafe rewrites: "
          f"{sum(o.unsafe_crash for _, o in outcomes)}; unsafe differing without a marker: "
          f"{sum(o.unsafe_unmarked for _, o in outcomes)}; of those, originals that could not run (twice): "
          f"{sum(o.original_failed for _, o in outcomes)}")
    print("safe rewrite migrates the whole script, by feature:")
    for (key, value), (done, total) in sorted(shares.items(), key=lambda item: str(item[0])):
        print(f"  {key}={value}: {done}/{total}")


if __name__ == "__main__":
    main()
