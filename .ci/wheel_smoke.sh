#!/usr/bin/env bash
# The README's commands, run against the built wheel installed in a fresh environment, from a
# folder outside the repository (so nothing is imported from the source tree).
set -euo pipefail
dist="$(cd "$1" && pwd)"
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
. "$work/venv/bin/activate"
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "torch==2.13.0"
wheel="$(ls "$dist"/*.whl)"
python -m pip install --quiet "$wheel[torch]"
cd "$work"
cp "$repo/fixtures/legacy/simple_o1.py" train_apex.py
ampmigrate --version
ampmigrate --list-rules > /dev/null
ampmigrate --explain AMP100 > /dev/null
python train_apex.py > /dev/null                        # `from apex import amp` served by ampshim
python -m ampshim --device cpu train_apex.py > /dev/null
cp train_apex.py train.py
status=0; ampmigrate --diff train.py > /dev/null || status=$?
test "$status" -eq 1                                    # 1: there is something to change
cmp train.py train_apex.py                              # --diff wrote nothing
ampmigrate train.py || true
! grep -q "from apex" train.py
python -m ampshim compare --device cpu train_apex.py train.py | tail -1 | grep -q "^SAME"
echo "wheel smoke test: the README's commands ran against $(basename "$wheel")"
