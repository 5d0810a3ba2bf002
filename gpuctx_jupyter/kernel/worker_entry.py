"""`python -m gpuctx_jupyter.kernel.worker_entry engine|controller [ipyparallel's arguments]`:
how `%gpu workers` starts ipyparallel's engines and controller; `… imports SOCKET`: the process
that does the workers' imports ahead and forks them (kernel/worker_zygote.py). A module of its
own, so that the state the kernel asks about later lives in those modules, not in `__main__`."""
import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["imports"]:
        from gpuctx_jupyter.kernel import worker_zygote

        worker_zygote.main(sys.argv[2:])
    else:
        from gpuctx_jupyter.kernel import worker_side

        worker_side.main(sys.argv[1:])
