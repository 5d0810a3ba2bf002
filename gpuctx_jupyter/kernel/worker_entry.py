"""`python -m gpuctx_jupyter.kernel.worker_entry engine|controller [ipyparallel's arguments]`:
how `%gpu workers` starts ipyparallel's engines and controller. A module of its own, so that the
state the kernel asks about later lives in `worker_side`, not in `__main__`."""
import sys

from gpuctx_jupyter.kernel import worker_side

if __name__ == "__main__":
    worker_side.main(sys.argv[1:])
