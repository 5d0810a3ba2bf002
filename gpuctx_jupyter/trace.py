"""`python -m gpuctx_jupyter.trace record|show …`: the documented command for recorded traces
(the code lives in core/trace.py)."""
from gpuctx_jupyter.core.trace import main

if __name__ == "__main__":
    main()
