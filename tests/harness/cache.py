"""What the slow tests build and reuse between runs — the Binder environment, the built wheel —
kept under the git-ignored .cache/tests/ (GPUCTX_TEST_CACHE moves it), each entry keyed by a hash
of the files it was built from: a change to any of them builds it anew, an unchanged tree reuses
it. Builders hold a file lock, so concurrent runs (xdist workers, two people's `make test`) build
an entry once and never see it half made."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT = Path(os.environ.get("GPUCTX_TEST_CACHE") or REPO / ".cache" / "tests")
SKIP_DIRS = {"node_modules", "__pycache__", ".yarn", "lib", ".ipynb_checkpoints"}


def tree_hash(paths: Iterable[str], skip: Iterable[str] = ()) -> str:
    """A hash of the names and contents of the files under `paths` (relative to the repository),
    leaving out build outputs and the relative paths in `skip`."""
    skipped = {REPO / p for p in skip}
    digest = hashlib.sha256(f"python {sys.version_info[:2]}".encode())
    for top in sorted(paths):
        for f in _files(REPO / top, skipped):
            if f.suffix not in (".pyc", ".tsbuildinfo"):
                digest.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _files(start: Path, skipped: set[Path]) -> Iterator[Path]:
    if start in skipped or not start.exists():
        return
    if start.is_file():
        yield start
        return
    for folder, dirs, names in os.walk(start):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and Path(folder, d) not in skipped)
        for name in sorted(names):
            if Path(folder, name) not in skipped:
                yield Path(folder, name)


@contextlib.contextmanager
def locked(name: str) -> Iterator[Path]:
    """The cache folder `name`, held exclusively until the block ends."""
    folder = ROOT / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        folder.mkdir(exist_ok=True)
        yield folder


def prune(prefix: str, keep: str) -> None:
    """Remove the entries named `prefix`* other than `keep` that nobody holds (older builds)."""
    for lock_path in ROOT.glob(f"{prefix}*.lock"):
        folder = lock_path.with_suffix("")
        if folder.name == keep:
            continue
        with open(lock_path, "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(folder, ignore_errors=True)
            lock_path.unlink(missing_ok=True)
