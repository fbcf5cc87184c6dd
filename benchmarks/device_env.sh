# shellcheck shell=bash
# The environment of a benchmark call on the device machine, sourced from the repository root:
#
#     source benchmarks/device_env.sh || exit; python3 benchmarks/bench_job_wall.py ...
#
# - installs the wheels the machine lacks (.whl/, fetched by shared/tools/device-wheels.sh and carried
#   with the call) into /tmp/site, and puts the repository and them on PYTHONPATH;
# - compiles bytecode into /tmp/pyc (PYTHONPYCACHEPREFIX) for the site-packages that hold torch, the
#   wheels and the repository. The machine ships torch without .pyc files and sets
#   PYTHONDONTWRITEBYTECODE=1, so without this every process compiles torch's, transformers' and
#   diffusers' Python from source: `import torch; from diffusers import SanaPipeline` took 17.4 s there
#   against 11.0 s with bytecode (benchmarks/results/job_wall_h200_s26.md). A user's pip-installed
#   environment has its bytecode, so timings without it overstate every mode's start-up alike.
# About 12 s on the H200 machine's 16 cores, once a machine (compileall skips what is current).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || return 1
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pyc
_site=$(python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))") || return 1
python3 -m compileall -q -j 0 "$_site" /tmp/site "$PWD" > /dev/null 2>&1
unset _site
