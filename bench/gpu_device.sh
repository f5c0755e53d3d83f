#!/bin/bash
# The GPU run on a lent machine that has no network: put the carried wheels in place, then run
# the command given (bench/gpu.py or bench/gpu_probe.py, with their options).
#
# Here, first: `make gpu-carry` (the release binary, oha, and in .whl/ the worker package and
# MOSEC 0.9.8 with what it needs that the machine lacks, as wheels for its Python 3.12). There,
# carrying target/release/corral, bench/.tools/bin/oha and .whl:
#
#   cp BENCHMARKS.md $OUT/ && bash bench/gpu_device.sh python3 bench/gpu.py \
#       --corral $PWD/target/release/corral --oha $PWD/bench/.tools/bin/oha \
#       --out $OUT/BENCHMARKS.md --workers 1 --repeats 3
#
# The machine's own torch, torchvision and msgpack are used; the wheels go to /tmp/site, and
# MOSEC's server binary (a script of its wheel) onto PATH.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$HOME/.local/bin"
install -m 755 /tmp/site/bin/mosec "$HOME/.local/bin/mosec"
export PATH=$HOME/.local/bin:$PATH
exec "$@"
