"""The stand-in libcuda (fake_libcuda.c) for machines without a GPU: built once per source into
the test cache, loaded by the real checkpoint helper through GPUCTX_LIBCUDA, with its processes'
states in a folder of the test's own (see the C file's comment for its files)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from . import cache

SOURCE = Path(__file__).with_name("fake_libcuda.c")


def library() -> str:
    """The built library's path (compiled with the system's C compiler the first time)."""
    key = cache.tree_hash([str(SOURCE.relative_to(cache.REPO))])
    with cache.locked(f"fake-libcuda-{key}") as folder:
        built = folder / "libcuda-standin.so"
        if not built.exists():
            cc = shutil.which("cc") or shutil.which("gcc")
            if cc is None:
                raise RuntimeError("the suspend tests build a stand-in libcuda and need a C compiler: "
                                   "apt-get install gcc")
            subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(built), str(SOURCE)], check=True)
    cache.prune("fake-libcuda-", f"fake-libcuda-{key}")
    return str(built)


class FakeCuda:
    """One test's stand-in driver: `env` for the processes that load it, and its files."""

    def __init__(self, folder: str | os.PathLike):
        self.dir = Path(folder)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.env = {"GPUCTX_LIBCUDA": library(), "GPUCTX_FAKE_CUDA_DIR": str(self.dir)}

    def start_cuda(self, pid: int) -> None:
        """The process `pid` has started CUDA (running)."""
        (self.dir / str(pid)).write_text("0\n")

    def state(self, pid: int) -> int | None:
        """0 running, 1 locked, 2 checkpointed (None: no CUDA)."""
        try:
            return int((self.dir / str(pid)).read_text())
        except (OSError, ValueError):
            return None

    def fail(self, pid: int, step: str, code: int, leave: int | None = None, times: int = 1) -> None:
        """The next `times` calls of `step` (lock, checkpoint, restore, unlock) on `pid` fail with
        `code`, leaving the state `leave` (None: unchanged)."""
        (self.dir / f"{pid}.fail.{step}").write_text(f"{code} {-1 if leave is None else leave} {times}")

    def busy(self, pid: int, on: bool = True) -> None:
        """`pid` is inside a CUDA call: a lock waits its timeout and fails (NOT_READY)."""
        path = self.dir / f"{pid}.busy"
        path.write_text("") if on else path.unlink(missing_ok=True)

    def hang(self, pid: int, step: str, on: bool = True) -> None:
        """The `step` on `pid` does not return while this is on (a driver call that hangs)."""
        path = self.dir / f"{pid}.hang.{step}"
        path.write_text("") if on else path.unlink(missing_ok=True)

    def hanging(self, pid: int, step: str) -> bool:
        """Whether a call of `step` on `pid` has entered a hang (and not come out: a helper killed
        there leaves this true)."""
        return (self.dir / f"{pid}.hanging.{step}").exists()

    def unhang_all(self) -> None:
        """End every hang (a test's clean-up: helpers left waiting then finish)."""
        for path in self.dir.glob("*.hang.*"):
            path.unlink(missing_ok=True)

    def log(self) -> list[tuple[str, int, int, float]]:
        """Every call so far: (step, pid, result, epoch seconds)."""
        try:
            lines = (self.dir / "log").read_text().splitlines()
        except OSError:
            return []
        return [(s, int(p), int(r), float(t)) for s, p, r, t in (line.split() for line in lines)]

    def steps(self, pid: int) -> list[str]:
        """The successful steps on `pid`, in order."""
        return [s for s, p, r, _t in self.log() if p == pid and r == 0]


# CUresult codes as driver 580 gave them (fake_libcuda.c)
OUT_OF_MEMORY, NOT_SUPPORTED, NOT_READY, ILLEGAL_STATE, OPERATING_SYSTEM = 2, 801, 600, 401, 304
