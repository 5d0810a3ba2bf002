"""`python -m gpuctx_jupyter.checkpoint support|state|suspend|resume PID …`: the helper process
that runs one CUDA checkpoint action on another process (the code lives in core/checkpoint.py)."""
import sys

from gpuctx_jupyter.core.checkpoint import main

if __name__ == "__main__":
    sys.exit(main())
