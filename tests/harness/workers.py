"""What the tests of `%gpu workers` share: the workers' view of themselves, their processes, a
kernel started for a notebook as the server's hook starts it, its prepared workers, the GPUs."""
from __future__ import annotations

import json
import os

import psutil

from . import kernels
from .kernels import run
from .notebooks import notebook
from .waiting import wait_for

# Every worker's view of itself, printed as JSON on its own line (names stay on the workers).
WHO = ("%%on_gpu all\nimport json, os, socket\nimport torch, torch.distributed as dist\n"
       "me = {k: os.environ.get(k) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', "
       "'MASTER_PORT', 'CUDA_VISIBLE_DEVICES')}\n"
       "me.update(pid=os.getpid(), cwd=os.getcwd(), backend=dist.get_backend(), rank=dist.get_rank(), "
       "initialized=dist.is_initialized(), host=socket.gethostname())\n"
       "print('WHO ' + json.dumps(me))")


def whos(text: str) -> list[dict]:
    return [json.loads(line.split("WHO ", 1)[1]) for line in text.splitlines() if "WHO {" in line]


def tree(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def gone(procs) -> bool:
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def stop_two(kc) -> None:
    """`%gpu workers stop` of two workers: said so in one line, and nothing of theirs left running."""
    every = tree(kernel_pid(kc))
    stopped = run(kc, "%gpu workers stop").stdout.strip()
    assert stopped == "gpuctx: stopped 2 workers and their ipyparallel controller", stopped
    wait_for(lambda: gone(every), timeout=60)


def private_folder(kc) -> str:
    """The ipyparallel profile folder gpuctx made for the kernel's workers (removed with them)."""
    folder = run(kc, "print(get_ipython()._gpuctx.workers._private_profile)").stdout.strip()
    assert os.path.isdir(folder)
    return folder


def kernel_pid(kc) -> int:
    return int(run(kc, "import os; print(os.getpid())").stdout)


STATE = ("import json; w = get_ipython()._gpuctx.workers\n"
         "print(json.dumps(None if w is None else w.report().data, default=str))")


def start_kernel(tmp_path, cells, config: str = ""):
    """A kernel for `train.ipynb` as the server's hook starts it: gpuctx loaded at start, the warm-up on."""
    folder = tmp_path / "work"
    folder.mkdir(parents=True)
    notebook(folder / "train.ipynb", cells)
    env = {"JPY_SESSION_NAME": str(folder / "train.ipynb"), "GPUCTX_WARM": "auto", "GPUCTX_WARM_SOURCE": "server hook"}
    if config:
        profile = tmp_path / "ipython" / "profile_default"
        profile.mkdir(parents=True, exist_ok=True)
        (profile / "ipython_kernel_config.py").write_text(config)
        env["IPYTHONDIR"] = str(tmp_path / "ipython")
    km, kc = kernels.start(env=env, extra_arguments=["--ext=gpuctx"], cwd=str(folder))
    return km, kc, folder


def workers_state(kc) -> dict | None:
    r = run(kc, STATE)
    assert r.reply["status"] == "ok", r.text
    return json.loads(r.stdout.strip().splitlines()[-1])


def prepared(kc, workers: int = 2) -> dict:
    """The prepared workers, once the kernel has started them (their processes, the controller's too)."""
    def ready():
        state = workers_state(kc)
        return state and state.get("prepared") and len(state["prepared"]["pids"]) == workers + 1 and state["prepared"]
    try:
        return wait_for(ready, timeout=120, every=0.3)
    except AssertionError:
        raise AssertionError(f"no workers were prepared: {workers_state(kc)}") from None


def imports_done(kc, workers: int = 2) -> str:
    """`%gpu workers` once every prepared worker says its imports are done (its warm-up's end)."""
    def done():
        text = run(kc, "%gpu workers").text
        return all(f"rank {r}: imports done" in text for r in range(workers)) and text
    return wait_for(done, timeout=240, every=0.5)


def processes(pids) -> list[psutil.Process]:
    return [psutil.Process(p) for p in pids]


def gpus() -> list[str]:
    """The visible GPUs' UUIDs in CUDA order, as NVML reads them (this process never starts CUDA)."""
    from gpuctx_jupyter.core import inventory

    return [d.record.uuid for d in inventory.take().devices]


def nvml_pids() -> set[int]:
    from gpuctx_jupyter.core import inventory

    return {p.pid for d in inventory.take().devices for p in d.record.processes}
