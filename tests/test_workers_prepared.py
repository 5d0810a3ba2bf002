"""Workers prepared ahead: a kernel whose notebook has a `%gpu workers start` line starts those
workers once it has read the notebook (imports only, no CUDA), and the line adopts them. Real
ipykernel processes started as the server's hook starts them, real ipyparallel engines (CPU
workers on gloo: no GPU in CI)."""
from __future__ import annotations

import pytest

from .harness import kernels
from .harness.gpus import NO_GPU
from .harness.kernels import run
from .harness.waiting import wait_for
from .harness.workers import WHO, gone, imports_done, kernel_pid, prepared, processes, tree, whos, workers_state
from .harness.workers import start_kernel as start_for

pytestmark = pytest.mark.timeout(600)
pytest.importorskip("ipyparallel")

START = "%gpu workers start 2" if NO_GPU else "%gpu workers start 2 --cpu"
CELLS = [START, "import numpy as np", "%%on_gpu all\nimport torch\nopt = torch.optim.AdamW([torch.zeros(1)])"]


def start_kernel(tmp_path, config: str = ""):
    return start_for(tmp_path, CELLS, config=config)


def test_the_notebooks_start_line_adopts_the_workers_prepared_for_it_and_they_see_its_environment(tmp_path):
    km, kc, folder = start_kernel(tmp_path)
    try:
        prep = prepared(kc)
        assert prep["line"] == START and prep["where"].startswith("cell 1")
        listing = run(kc, "%gpu workers").text
        assert f"prepared for `{START}` (cell 1" in listing and "no CUDA, no GPU memory" in listing
        listing = imports_done(kc)  # each worker's own word, asked through ipyparallel
        assert "rank 0: imports done in" in listing and "rank 1: imports done in" in listing, listing
        assert set(prep["pids"]) <= {p.pid for p in tree(kernel_pid(kc))}  # the kernel's own, ended with it
        run(kc, "import os; os.environ['GPUCTX_TEST_NOTE'] = 'set by the notebook'")  # read by no import
        # torch sets TORCHINDUCTOR_CACHE_DIR itself the first time inductor looks for its cache
        run(kc, "from torch._inductor.runtime.cache_dir_utils import cache_dir; cache_dir()")
        assert "TORCHINDUCTOR_CACHE_DIR" in run(kc, "print(sorted(os.environ))").stdout
        r = run(kc, START, timeout=300)
        assert r.reply["status"] == "ok", r.text
        assert "(prepared" in r.stdout and "for cell 1, line 1: imports done)" in r.stdout, r.stdout
        assert "gpuctx: 2 workers ready in" in r.stdout and "imports (prepared ahead)" in r.stdout, r.stdout
        ranks = whos(run(kc, WHO).text)
        assert {w["pid"] for w in ranks} < set(prep["pids"]) and {w["backend"] for w in ranks} == {"gloo"}
        notes = run(kc, "%%on_gpu all\nimport os\nos.environ.get('GPUCTX_TEST_NOTE')")
        assert notes.reply["status"] == "ok" and "set by the notebook" in notes.text, notes.text
        every = tree(kernel_pid(kc))
    finally:
        kernels.stop(km, kc)
    wait_for(lambda: gone(every), timeout=60)


def test_an_import_time_setting_made_after_preparing_gets_new_workers_and_the_old_ones_end(tmp_path):
    km, kc, _ = start_kernel(tmp_path)
    try:
        old = processes(prepared(kc)["pids"])
        run(kc, "import os; os.environ['TORCH_SHOW_CPP_STACKTRACES'] = '1'")
        r = run(kc, START, timeout=300)
        assert r.reply["status"] == "ok", r.text
        assert (f"stopping the workers prepared for `{START}`: the notebook set TORCH_SHOW_CPP_STACKTRACES after "
                "they had imported what reads it; starting new ones") in r.stdout, r.stdout
        wait_for(lambda: gone(old), timeout=60)
        ranks = whos(run(kc, WHO).text)
        assert len(ranks) == 2 and not {w["pid"] for w in ranks} & {p.pid for p in old}
        seen = run(kc, "%%on_gpu all\nimport os\nos.environ.get('TORCH_SHOW_CPP_STACKTRACES')")
        assert "'1'" in seen.text, seen.text
    finally:
        kernels.stop(km, kc)


def test_a_different_count_gets_fresh_workers_and_stop_ends_prepared_ones(tmp_path):
    km, kc, _ = start_kernel(tmp_path)
    try:
        old = processes(prepared(kc)["pids"])
        one = START.replace("start 2", "start 1")
        r = run(kc, one, timeout=300)
        assert r.reply["status"] == "ok", r.text
        assert f"they were started for `{START}` (cell 1, line 1)" in r.stdout and "1 worker ready in" in r.stdout
        wait_for(lambda: gone(old), timeout=60)
        assert "stopped 1 worker" in run(kc, "%gpu workers stop").stdout
    finally:
        kernels.stop(km, kc)
    km, kc, _ = start_kernel(tmp_path / "again")
    try:
        old = processes(prepared(kc)["pids"])
        assert run(kc, "%gpu workers stop").stdout.strip() == (
            f"gpuctx: stopped the workers prepared for `{START}` and their ipyparallel controller")
        wait_for(lambda: gone(old), timeout=60)
        assert "were stopped by `%gpu workers stop`" in run(kc, "%gpu workers").text
        # the notebook's plan carried out again (after a suspend that did not happen, say) names the
        # line still: what the user stopped is not started again behind their back
        again = run(kc, f"print(get_ipython()._gpuctx.workers.prepare_for({START.split('start ', 1)[1]!r}))")
        assert again.stdout.strip() == "False" and workers_state(kc)["prepared"] is None, again.text
    finally:
        kernels.stop(km, kc)


def test_turned_off_nothing_is_prepared_and_the_listing_says_so(tmp_path):
    km, kc, _ = start_kernel(tmp_path, config="c.GpuWorkers.prepare = False\n")
    try:
        def said():
            state = workers_state(kc)
            return state and state["prepare_note"]
        assert wait_for(said, timeout=120, every=0.3) == "not prepared ahead (c.GpuWorkers.prepare is off)"
        assert workers_state(kc)["prepared"] is None
        assert not [p for p in tree(kernel_pid(kc)) if "worker_entry" in " ".join(p.cmdline())]
    finally:
        kernels.stop(km, kc)
