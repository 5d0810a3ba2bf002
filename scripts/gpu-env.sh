# Sourced by the GPU scripts (gpu-check.sh, gpu-notebooks.sh, oom-demo.sh), from the repository
# root: sets `py` (the project's .venv when there is one, else python3; PYTHON overrides),
# `results` ($OUT, else benchmarks/results/), PYTHONPATH and PYTHONPYCACHEPREFIX. A Python without
# jupyter_server or ipyparallel (the GPU machine) gets the Jupyter stack from .devwheels, installed
# once into /tmp/gpuctx-site; build it where there is a network with scripts/gpu-wheels.sh.
py="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
export PYTHON="$py"
results="${OUT:-benchmarks/results}"
mkdir -p "$results"
export PYTHONPATH="$PWD"
if ! "$py" -c "import jupyter_server, ipyparallel" 2>/dev/null; then
  if [ ! -d /tmp/gpuctx-site/jupyter_server ] || [ ! -d /tmp/gpuctx-site/ipyparallel ]; then
    ls .devwheels/*.whl >/dev/null 2>&1 || { echo "no jupyter_server or ipyparallel for $py, and no .devwheels/ to install them from (scripts/gpu-wheels.sh)"; exit 1; }
    "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpuctx-site .devwheels/*.whl || exit 1
  fi
  export PYTHONPATH="/tmp/gpuctx-site:$PWD"
fi
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
# Bytecode where Python can write it: on the GPU machine every process compiled torch's sources
# (scripts/probe-gil.py --calls: its environment keeps no bytecode), part of its 3-4 s `import torch`,
# cold and warmed alike; an installation people use has bytecode. The first process fills this folder.
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-/tmp/gpuctx-pycache}"
# ... which needs Python allowed to write bytecode at all: with PYTHONDONTWRITEBYTECODE set, every
# process compiles every module it imports that has no bytecode yet (the Jupyter stack installed
# below --no-compile, gpuctx), each kernel's start included (2.4 s on the H200 in the twelfth run,
# 0.5 s on the CPU machine; benchmarks/readiness.py now records whether bytecode was written). So
# gpuctx and the Jupyter stack are compiled once, as pip does at install.
unset PYTHONDONTWRITEBYTECODE
"$py" -m compileall -q -j 0 gpuctx_jupyter $([ -d /tmp/gpuctx-site ] && echo /tmp/gpuctx-site) > /dev/null 2>&1 || true
