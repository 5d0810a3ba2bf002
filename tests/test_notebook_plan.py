"""The `notebook` warm recipe: plans derived from real-looking notebooks, read without running them."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from gpuctx_jupyter import contract
from gpuctx_jupyter.kernel.warm import plan as npl

from .harness.notebooks import notebook

HAVE = {"torch", "cupy", "jax", "numba"}  # frameworks "installed" for the derivation


def derive(path, **kw):
    kw.setdefault("installed", lambda name: name in HAVE)
    kw.setdefault("environ", {})
    return npl.derive(str(path), **kw)


def steps(plan, kind=None, state=None):
    return [s for s in plan.steps if (kind is None or s.kind == kind) and (state is None or s.state == state)]


def names(plan, kind=None, state="planned"):
    return [s.name for s in steps(plan, kind, state)]


def ops(plan):
    return [s.op for s in steps(plan, state="planned") if s.op]


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site-packages folder on sys.path holding the packages a test writes into it."""
    folder = tmp_path / "lib" / "site-packages"
    folder.mkdir(parents=True)
    monkeypatch.syspath_prepend(str(folder))

    def install(name: str, code: str = "") -> None:
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text(code)
    return install


# -- imports ---------------------------------------------------------------------------------------
def test_top_level_imports_in_notebook_order_stdlib_and_duplicates_left_out(tmp_path, site):
    for pkg in ("alpha", "beta", "gamma"):
        site(pkg)
    notebook(tmp_path / "nb.ipynb", ["import os, sys\nimport alpha\nfrom beta import thing, other as o",
                                     "import json\nimport alpha\nfrom gamma.sub import x\nimport torch"])
    plan = derive(tmp_path / "nb.ipynb")
    assert names(plan, "import") == ["import alpha", "from beta import thing, other", "from gamma.sub import x",
                                     "import torch"]
    first = steps(plan, "import")[0]
    assert (first.where, first.code) == ("cell 1, line 2", "import alpha")
    assert steps(plan, "import")[3].framework == "torch"  # the notebook's own import brings the framework
    assert not steps(plan, "framework")  # ... so no second import of it


def test_conditional_and_nested_imports_are_not_warmed(tmp_path, site):
    for pkg in ("infunc", "inif", "intry", "inwith", "top"):
        site(pkg)
    notebook(tmp_path / "nb.ipynb", [
        "def load():\n    import infunc\n    return infunc",
        "if True:\n    import inif\ntry:\n    import intry\nexcept ImportError:\n    intry = None",
        "with open(__file__) as fh:\n    import inwith\nclass A:\n    import top as t2\nimport top",
    ])
    assert names(derive(tmp_path / "nb.ipynb"), "import") == ["import top"]


def test_magics_and_shell_escapes_are_stripped_and_lines_keep_their_numbers(tmp_path, site):
    site("alpha")
    notebook(tmp_path / "nb.ipynb", ["%load_ext gpuctx\n!nvidia-smi\nfiles = !ls\nos?\n%matplotlib inline\nimport alpha",
                                     "%%time\nimport torch\nx = 1"])
    plan = derive(tmp_path / "nb.ipynb")
    assert [(s.name, s.where) for s in steps(plan, "import")] == [("import alpha", "cell 1, line 6"),
                                                                   ("import torch", "cell 2, line 2")]


def test_cells_of_other_languages_are_skipped(tmp_path, site):
    site("alpha")
    notebook(tmp_path / "nb.ipynb", ["%%bash\nimport alpha\n", "%%writefile x.py\nimport alpha\n", "x = 1"])
    plan = derive(tmp_path / "nb.ipynb")
    assert not steps(plan, "import") and not plan.notes


def test_a_syntax_error_skips_that_cell_only_and_says_so(tmp_path, site):
    site("alpha")
    site("beta")
    notebook(tmp_path / "nb.ipynb", ["import alpha\nprint('unclosed'", "import beta\nimport torch"])
    plan = derive(tmp_path / "nb.ipynb")
    assert names(plan, "import") == ["import beta", "import torch"]
    assert any("cell 1: syntax error on line 2" in n for n in plan.notes)
    assert "syntax error" in "\n".join(plan.lines())


def test_a_local_module_shadowing_an_installed_one_is_never_imported(tmp_path, site, monkeypatch):
    site("requests_like")
    nb_dir = tmp_path / "project"
    nb_dir.mkdir()
    (nb_dir / "requests_like.py").write_text("raise SystemExit('must not run')\n")
    (nb_dir / "helpers.py").write_text("raise SystemExit('must not run')\n")
    monkeypatch.syspath_prepend(str(nb_dir))  # the kernel runs in the notebook's folder
    notebook(nb_dir / "nb.ipynb", "import requests_like\nimport helpers\nimport torch")
    plan = derive(nb_dir / "nb.ipynb", cwd=str(nb_dir))
    skipped = {s.module: s.detail for s in steps(plan, "import", "skipped")}
    assert set(skipped) == {"requests_like", "helpers"}
    assert all("local code" in why for why in skipped.values()), skipped
    assert "requests_like" not in sys.modules and "helpers" not in sys.modules  # found without importing


def test_an_editable_install_is_never_imported(tmp_path, monkeypatch):
    src = tmp_path / "checkout" / "src"
    (src / "mylib").mkdir(parents=True)
    (src / "mylib" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(src))  # what an editable install's .pth adds
    (tmp_path / "work").mkdir()
    notebook(tmp_path / "work" / "nb.ipynb", "import mylib\nimport torch")
    plan = derive(tmp_path / "work" / "nb.ipynb")
    (step,) = steps(plan, "import", "skipped")
    assert step.module == "mylib" and "not an installed package" in step.detail


def test_missing_modules_the_deny_list_and_the_cap(tmp_path, site):
    for i in range(5):
        site(f"pkg{i}")
    site("wandb")
    notebook(tmp_path / "nb.ipynb", ["import gpuctx_not_installed_anywhere\nimport wandb\nimport matplotlib.pyplot as plt",
                                     "\n".join(f"import pkg{i}" for i in range(5))])
    plan = derive(tmp_path / "nb.ipynb", max_imports=3)
    detail = {s.module: s.detail for s in steps(plan, "import")}
    assert detail["gpuctx_not_installed_anywhere"] == "not installed in this kernel"
    assert "deny list (wandb)" in detail["wandb"] and "deny list (matplotlib.pyplot)" in detail["matplotlib.pyplot"]
    assert [s.module for s in steps(plan, "import", "planned")] == ["pkg0", "pkg1", "pkg2"]
    assert "more than 3 imports" in detail["pkg3"]
    assert npl.denied("pycuda.autoinit", npl.DEFAULT_DENY) == "pycuda"
    assert npl.denied("tensorflow", npl.DEFAULT_DENY) and npl.denied("google.colab", npl.DEFAULT_DENY)


def test_a_name_taken_from_a_package_that_the_deny_list_names_keeps_the_import_out(tmp_path, site):
    """`from matplotlib import pyplot` imports matplotlib.pyplot as surely as `import
    matplotlib.pyplot` (the deny list's entry): neither the notebook's plan nor a standby's does it."""
    site("gpuctx_plotlib")
    deny = (*npl.DEFAULT_DENY, "gpuctx_plotlib.pyplot")
    notebook(tmp_path / "nb.ipynb", "from gpuctx_plotlib import pyplot as plt\nfrom gpuctx_plotlib import colors")
    detail = {s.name: (s.state, s.detail) for s in steps(derive(tmp_path / "nb.ipynb", deny=deny), "import")}
    assert detail["from gpuctx_plotlib import pyplot"] == ("skipped", "on the deny list (gpuctx_plotlib.pyplot): "
                                                                       "importing it has side effects")
    standby = npl.imports_only(["gpuctx_plotlib", "gpuctx_plotlib:pyplot", "gpuctx_plotlib:colors"], deny=deny)
    assert [s.name for s in standby.steps] == ["import gpuctx_plotlib", "from gpuctx_plotlib import colors"]


# -- set-up ----------------------------------------------------------------------------------------
def test_safe_literal_setup_before_the_imports_is_applied_first(tmp_path):
    notebook(tmp_path / "nb.ipynb", [("import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '1'\n"
                                      "os.environ.setdefault('HF_HOME', '/data/hf')\n"
                                      "%env XLA_PYTHON_CLIENT_PREALLOCATE=false"),
                                     "import torch"])
    plan = derive(tmp_path / "nb.ipynb")
    setup = steps(plan, "setup", "planned")
    assert [s.env for s in setup] == [("CUDA_VISIBLE_DEVICES", "1"), ("HF_HOME", "/data/hf"),
                                      ("XLA_PYTHON_CLIENT_PREALLOCATE", "false")]
    assert not plan.stopped and not plan.gpu_blocked
    assert plan.steps.index(setup[-1]) < plan.steps.index(steps(plan, "import")[0])


def test_setup_never_overrides_the_kernels_environment(tmp_path):
    notebook(tmp_path / "nb.ipynb", "import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '1'\nimport torch")
    plan = derive(tmp_path / "nb.ipynb", environ={"CUDA_VISIBLE_DEVICES": "0"})
    (step,) = steps(plan, "setup")
    assert step.state == "skipped" and "never overrides" in step.detail
    assert plan.gpu_blocked and "cell 1, line 2" in plan.gpu_blocked
    assert steps(plan, "import")[0].state == "skipped"  # import torch comes after it
    same = derive(tmp_path / "nb.ipynb", environ={"CUDA_VISIBLE_DEVICES": "1"})
    assert steps(same, "setup")[0].state == "done" and not same.gpu_blocked


def test_setup_the_plan_cannot_apply_stops_it_before_the_next_import(tmp_path, site):
    site("alpha")
    site("beta")
    notebook(tmp_path / "nb.ipynb", ["import alpha\nimport sys\nsys.path.insert(0, '../src')\nimport beta", "import torch"])
    plan = derive(tmp_path / "nb.ipynb")
    assert names(plan, "import") == ["import alpha"]
    assert "cell 1, line 3" in plan.stopped and "sys.path" in plan.stopped
    assert not plan.gpu_blocked  # sys.path says nothing about CUDA


@pytest.mark.parametrize("code", ["os.environ['CUDA_VISIBLE_DEVICES'] = str(gpu)", "os.environ['MY_SETTING'] = 'x'",
                                  "from dotenv import load_dotenv\nload_dotenv()", "%pip install -U transformers",
                                  "!pip install transformers", "%cd ../other"])
def test_other_setup_before_the_imports_keeps_them_for_the_notebook(tmp_path, code):
    notebook(tmp_path / "nb.ipynb", [f"import os\ngpu = 1\n{code}", "import torch\nx = torch.ones(1, device='cuda')"])
    plan = derive(tmp_path / "nb.ipynb")
    assert plan.stopped and not names(plan, "import")
    gpu_related = "CUDA" in code or "dotenv" in code
    assert bool(plan.gpu_blocked) == gpu_related, plan.gpu_blocked


def test_gpu_setting_after_the_first_import_blocks_gpu_work(tmp_path):
    notebook(tmp_path / "nb.ipynb", ["import torch", "import os\nos.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'"])
    plan = derive(tmp_path / "nb.ipynb")
    assert names(plan, "import") == ["import torch"]  # before it: fine
    assert "cell 2, line 2" in plan.gpu_blocked


# -- frameworks, work, devices ---------------------------------------------------------------------
def test_a_cupy_only_notebook_gets_no_torch(tmp_path):
    notebook(tmp_path / "nb.ipynb", "import cupy as cp\nx = cp.ones(3)")
    plan = derive(tmp_path / "nb.ipynb")
    assert plan.frameworks == ["cupy"]
    assert not [s for s in plan.steps if s.framework == "torch"]
    assert ops(plan) == ["cupy_ops"]


def test_jax_gets_its_backend_and_a_jit_warmed_and_numba_a_tiny_cuda_kernel(tmp_path):
    notebook(tmp_path / "nb.ipynb", ["import jax.numpy as jnp\nfrom numba import cuda\n@cuda.jit\ndef k(x):\n    pass",
                                     "import jax\nf = jax.jit(jax.grad(loss))"])
    plan = derive(tmp_path / "nb.ipynb")
    assert plan.frameworks == ["jax", "numba"]
    assert ops(plan) == ["jax_jit", "numba_jit"]  # JAX's is skipped while it would preallocate (75% of each GPU)
    step = next(s for s in plan.steps if s.op == "jax_jit")
    assert step.where == "cell 2, line 2" and "preallocat" in step.detail
    assert "import numba.cuda" in names(plan, "framework")


def test_frameworks_not_installed_are_skipped_not_warmed(tmp_path):
    notebook(tmp_path / "nb.ipynb", "try:\n    import cupy\nexcept ImportError:\n    cupy = None\nimport torch")
    plan = npl.derive(str(tmp_path / "nb.ipynb"), installed=lambda n: n == "torch", environ={})
    assert plan.frameworks == ["torch"]
    assert [s.detail for s in steps(plan, "framework", "skipped")] == ["cupy is not installed in this kernel"]


def test_an_mlp_notebook_plans_base_ops_only(tmp_path):
    notebook(tmp_path / "nb.ipynb", ["import torch\nfrom torch import nn",
                                     ("model = nn.Linear(4, 2).cuda()\nmodel.eval()\n"
                                      "with torch.inference_mode():\n    y = model(torch.randn(8, 4, device='cuda'))")])
    assert ops(derive(tmp_path / "nb.ipynb")) == ["cuda_init", "alloc", "elementwise", "matmul_fp32"]


def test_training_precision_and_conv_each_name_their_line(tmp_path):
    notebook(tmp_path / "nb.ipynb", [
        "import torch\nimport torch.nn as nn",
        ("net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))\n"
         "opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)\nscaler = torch.amp.GradScaler()"),
        "with torch.autocast('cuda', dtype=torch.float16):\n    loss = net(x).sum()\nscaler.scale(loss).backward()",
    ])
    plan = derive(tmp_path / "nb.ipynb")
    # in the order the cells need them: a first GPU cell's work, training, then precisions and the rest
    assert ops(plan) == ["cuda_init", "alloc", "elementwise", "matmul_fp32", "backward", "optimizer", "grad_scaler",
                         "matmul_fp16", "conv", "autocast"]
    by_op = {s.op: s for s in plan.steps}
    assert by_op["conv"].where == "cell 2, line 1"
    assert by_op["optimizer"].name == "optimizer step (SGD with momentum)"
    assert by_op["optimizer"].where == "cell 2, line 2" and by_op["grad_scaler"].where == "cell 2, line 3"


def test_bf16_attention_notebook(tmp_path):
    notebook(tmp_path / "nb.ipynb", "import torch\nimport torch.nn.functional as F\n"
                                    "q = torch.randn(2, 4, 8, 16, device='cuda', dtype=torch.bfloat16)\n"
                                    "out = F.scaled_dot_product_attention(q, q, q)")
    assert ops(derive(tmp_path / "nb.ipynb")) == ["cuda_init", "alloc", "elementwise", "matmul_fp32", "matmul_bf16",
                                                 "attention"]


@pytest.mark.parametrize("cells, devices", [
    (["%load_ext gpuctx\n%gpu use 1", "import torch"], ["1"]),
    (["%%on_gpu 0\nimport torch\nx = torch.ones(1)"], ["0"]),
    (["%%on_gpu all\nimport torch\nx = torch.ones(1)", "%%on_gpu 0,1\nx"], []),  # the workers' GPUs
    (["import torch\ntorch.cuda.set_device(1)"], ["1"]),
    (["import torch\na = torch.ones(1, device='cuda:0')\nb = torch.ones(1, device='cuda:1')"], ["0", "1"]),
    (["%gpu use 1", "import torch\nb = torch.ones(1, device=torch.device('cuda', 0))"], ["1", "0"]),
    (["import torch\nx = torch.ones(1, device='cuda')"], []),
])
def test_the_device_the_notebook_names_is_warmed(tmp_path, cells, devices):
    notebook(tmp_path / "nb.ipynb", cells)
    plan = derive(tmp_path / "nb.ipynb")
    assert plan.devices == devices
    cuda_init = next(s for s in plan.steps if s.op == "cuda_init")
    if devices:
        assert cuda_init.where.startswith("cell 1")


# -- odd notebooks ---------------------------------------------------------------------------------
def test_a_new_empty_notebook_imports_torch_only(tmp_path):
    notebook(tmp_path / "nb.ipynb", ["", "  \n"])
    plan = derive(tmp_path / "nb.ipynb")
    assert plan.recipe == "imports only" and not plan.gpu
    assert [s.name for s in plan.steps] == ["import torch"] and not ops(plan)


@pytest.mark.parametrize("content", ["not json at all", json.dumps([1, 2]), json.dumps({"cells": "x"}), ""])
def test_a_file_that_is_not_a_notebook_falls_back_to_the_basic_recipe_and_says_why(tmp_path, content):
    (tmp_path / "nb.ipynb").write_text(content)
    plan = derive(tmp_path / "nb.ipynb")
    assert plan.recipe == "basic" and plan.reading.startswith("cannot read the notebook")
    assert ops(plan) == ["cuda_init", *contract.DEFAULT_OPS]


def test_no_notebook_at_all_is_the_basic_recipe(tmp_path):
    plan = npl.derive(None, extra_imports=("alpha",), environ={})
    assert plan.recipe == "basic" and "JPY_SESSION_NAME unset" in plan.reading
    assert [s.name for s in plan.steps][:2] == ["import alpha", "import torch"]


def test_training_ops_without_a_notebook_are_named_as_a_notebooks_plan_names_them():
    """A worker whose kernel has no notebook (`%gpu workers` in a bare kernel) warms the basic
    recipe plus the training steps; its optimizer step says what it runs, as in a notebook's plan."""
    from gpuctx_jupyter.kernel.worker_side import TRAINING_OPS

    plan = npl.derive(None, extra_ops=TRAINING_OPS, environ={})
    by_op = {s.op: s for s in plan.steps}
    assert plan.recipe == "basic" and ops(plan)[-2:] == ["backward", "optimizer"]
    assert by_op["optimizer"].name == "optimizer step (AdamW and SGD with momentum)"


def test_a_notebook_without_a_gpu_framework_warms_its_imports_only(tmp_path, site):
    site("alpha")
    notebook(tmp_path / "nb.ipynb", "import alpha\nprint('hi')")
    plan = derive(tmp_path / "nb.ipynb")
    assert names(plan) == ["import alpha"] and not plan.gpu


def test_the_notebooks_opt_out_plans_nothing(tmp_path):
    notebook(tmp_path / "nb.ipynb", "import torch", metadata={"gpuctx": {"warm": False}})
    plan = derive(tmp_path / "nb.ipynb")
    assert not plan.steps and "opts out" in plan.reading


def test_markdown_and_raw_cells_count_in_cell_numbers(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "source": "# Title", "metadata": {}},
                    {"cell_type": "code", "source": ["import os\n", "import torch\n"], "metadata": {}, "outputs": [],
                     "execution_count": None}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "nb.ipynb").write_text(json.dumps(nb))
    assert steps(derive(tmp_path / "nb.ipynb"), "import")[0].where == "cell 2, line 2"


def test_plan_is_json_and_lines_show_each_step_with_its_line(tmp_path):
    notebook(tmp_path / "nb.ipynb", ["%gpu use 1", "import torch\nopt = torch.optim.AdamW(params)"])
    plan = derive(tmp_path / "nb.ipynb")
    d = json.loads(json.dumps(plan.as_dict()))
    assert d["recipe"] == "notebook" and d["devices"] == ["1"]
    assert {"kind", "name", "where", "code", "state", "detail", "seconds"} <= set(d["steps"][0])
    lines = plan.lines()
    assert lines[0].startswith("warm plan (notebook) from nb.ipynb")
    assert any("optimizer step (AdamW)" in line and "cell 2, line 2: opt = torch.optim.AdamW(params)" in line
               for line in lines)
    assert any("cuda init" in line and "cell 1, line 1: %gpu use 1" in line for line in lines)


def test_basic_recipe_is_the_fixed_one():
    plan = npl.basic(("torch", "jax"), ("alloc", "backward"), ("transformers",))
    assert [s.name for s in plan.steps] == ["import transformers", "import torch", "import jax", "cuda init", "alloc",
                                            "backward", "import jax.numpy", "JAX backend and a tiny jit(grad)"]


# -- the contract ----------------------------------------------------------------------------------
def test_the_recipe_travels_in_the_warm_plan():
    plan = contract.WarmSettings(policy="auto", recipe="basic")
    env = plan.to_env()
    assert env[contract.WARM_RECIPE] == "basic"
    assert contract.WarmSettings.from_env(env).recipe == "basic"
    assert contract.WarmSettings.from_env({}).recipe == "notebook"
    assert contract.parse_recipe("Notebook ") == "notebook" and contract.parse_recipe("bogus") == "notebook"


# -- the order the notebook needs them in ----------------------------------------------------------
def test_torch_dynamo_is_imported_in_the_background_right_after_torch_when_the_notebook_trains(tmp_path, site):
    site("alpha")
    notebook(tmp_path / "nb.ipynb", ["import torch\nimport alpha", "opt = torch.optim.AdamW(params)"])
    plan = derive(tmp_path / "nb.ipynb")
    names_ = [s.name for s in plan.steps]
    assert names_[:3] == ["import torch", "import torch._dynamo", "import alpha"]
    assert next(s for s in plan.steps if s.module == "torch._dynamo").overlap
    notebook(tmp_path / "infer.ipynb", ["import torch", "y = torch.ones(3, device='cuda')"])
    assert "import torch._dynamo" not in [s.name for s in derive(tmp_path / "infer.ipynb").steps]


def test_what_lightning_imports_on_its_first_trainer_comes_after_the_training_steps_where_installed(tmp_path, site):
    site("lightning")
    notebook(tmp_path / "nb.ipynb", ["import torch\nimport lightning as L", "opt = torch.optim.AdamW(params)",
                                     "trainer = L.Trainer(max_epochs=1)"])
    plan = derive(tmp_path / "nb.ipynb")
    if importlib.util.find_spec("mpi4py") is None:  # mpi4py is not installed: nothing
        assert "from mpi4py import MPI" not in [s.name for s in plan.steps]
    site("mpi4py")
    plan = derive(tmp_path / "nb.ipynb")
    order = [s.name for s in plan.steps]
    mpi = next(s for s in plan.steps if s.module == "mpi4py")
    assert (mpi.name, mpi.names, mpi.state, mpi.where) == ("from mpi4py import MPI", ("MPI",), "planned", "cell 1, line 2")
    assert "Trainer" in mpi.detail
    assert order.index("import lightning") < order.index("optimizer step (AdamW)") < order.index("from mpi4py import MPI")
    notebook(tmp_path / "plain.ipynb", ["import torch", "opt = torch.optim.AdamW(params)"])
    assert "from mpi4py import MPI" not in [s.name for s in derive(tmp_path / "plain.ipynb").steps]
    assert "from mpi4py import MPI" not in [s.name for s in derive(tmp_path / "nb.ipynb", deny=("mpi4py",)).steps]


def test_later_cells_imports_come_after_the_gpu_work_of_the_first_gpu_cell(tmp_path, site):
    for name in ("early", "late"):
        site(name)
    notebook(tmp_path / "nb.ipynb", ["import torch\nimport early", "x = torch.randn(8, 8, device='cuda')",
                                     "import late\nprint(late)"])
    order = [s.name for s in derive(tmp_path / "nb.ipynb").steps]
    assert order.index("import early") < order.index("cuda init") < order.index("matmul fp32") < order.index("import late")
    notebook(tmp_path / "nogpu.ipynb", ["import torch\nimport early", "import late"])  # no GPU cell: imports first
    order = [s.name for s in derive(tmp_path / "nogpu.ipynb").steps]
    assert order.index("import late") < order.index("cuda init")


def test_a_torch_compile_notebook_plans_a_compile_after_its_first_work(tmp_path):
    notebook(tmp_path / "nb.ipynb", ["import torch", "model = torch.compile(torch.nn.Linear(4, 4).cuda())"])
    plan = derive(tmp_path / "nb.ipynb")
    step = next(s for s in plan.steps if s.op == "compile")
    assert step.where == "cell 2, line 1" and "torch.compile" in step.code
    assert ops(plan).index("compile") > ops(plan).index("matmul_fp32")


@pytest.mark.parametrize("line", ["scripted = torch.jit.script(torch.nn.Linear(4, 4))",
                                  "traced = torch.jit.trace(torch.nn.Linear(4, 4), torch.ones(1, 4))",
                                  "@torch.compile\ndef f(x):\n    return x.sin()"])
def test_torch_jit_script_trace_and_the_compile_decorator_plan_the_compile_warm_up(tmp_path, line):
    notebook(tmp_path / "nb.ipynb", ["import torch", line])
    plan = derive(tmp_path / "nb.ipynb")
    step = next(s for s in plan.steps if s.op == "compile")
    assert step.where.startswith("cell 2, line ")


def test_a_bf16_model_gets_its_own_training_step_and_an_autocast_one_does_not(tmp_path):
    torch = pytest.importorskip("torch")
    from gpuctx_jupyter.kernel.warm.recipes import torch as recipe

    notebook(tmp_path / "bf16.ipynb", ["import torch", "block = torch.nn.Linear(8, 8).to(device='cuda', dtype=torch.bfloat16)\n"
                                       "opt = torch.optim.AdamW(block.parameters())", "opt.step()"])
    notebook(tmp_path / "amp.ipynb", ["import torch", "scaler = torch.amp.GradScaler('cuda')\n"
                                      "with torch.autocast('cuda', dtype=torch.bfloat16):\n    y = model(x)",
                                      "opt = torch.optim.SGD(model.parameters(), lr=0.1)"])
    assert recipe.low_precision(torch, set(ops(derive(tmp_path / "bf16.ipynb")))) == (torch.bfloat16,)
    assert recipe.low_precision(torch, set(ops(derive(tmp_path / "amp.ipynb")))) == ()  # autocast: fp32 parameters
    # the step itself, on the CPU here: a bf16 block's forward, backward and optimizer steps
    params = recipe.low_precision_step(torch, torch.device("cpu"), torch.bfloat16, ("adamw", "sgd"))
    assert {p.dtype for p in params} == {torch.bfloat16} and all(p.grad is not None for p in params)


def test_a_cell_read_again_gives_the_same_facts_and_an_edited_one_its_new_facts():
    """Cells are parsed once per number and text (typed cells come again after every pause): the
    facts of cells read before are theirs, and an edit, or the same text in another place, is read
    as it now stands."""
    from gpuctx_jupyter.contract.notebook import facts_from_sources

    from gpuctx_jupyter.contract.notebook import _cell_facts

    first = facts_from_sources(["import torch\nx = torch.ones(3, device='cuda:1')", "%gpu use 0"])
    hits = _cell_facts.cache_info().hits
    again = facts_from_sources(["import torch\nx = torch.ones(3, device='cuda:1')", "%gpu use 0"])
    assert _cell_facts.cache_info().hits == hits + 2  # neither cell parsed again
    again.frameworks["jax"] = again.frameworks["torch"]  # a reader's own copy: changing it changes no other
    assert "jax" not in facts_from_sources(["import torch\nx = torch.ones(3, device='cuda:1')", "%gpu use 0"]).frameworks
    del again.frameworks["jax"]
    assert (again.frameworks, again.events, again.cuda_literals, again.magics) == (
        first.frameworks, first.events, first.cuda_literals, first.magics)
    edited = facts_from_sources(["import jax\nx = 1", "%gpu use 0"])
    assert list(edited.frameworks) == ["jax"] and edited.cuda_literals == []
    moved = facts_from_sources(["%gpu use 0", "import torch\nx = torch.ones(3, device='cuda:1')"])
    assert moved.magics.cell == 1 and moved.frameworks["torch"].cell == 2


BENCH_NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", BENCH_NOTEBOOKS, ids=lambda p: p.stem)
def test_each_benchmark_notebooks_plan_is_in_the_order_its_cells_need(path):
    """The real notebooks the benchmarks play: set-up first; the imports up to the first GPU cell
    before CUDA; CUDA's start before any other GPU work; what a first GPU cell runs before the
    training steps; torch._dynamo in the background right after torch where the notebook trains;
    the later cells' own imports after all the work."""
    from gpuctx_jupyter.contract.notebook import read

    plan = derive(path)
    first_gpu = npl._first_gpu_cell(read(str(path)))
    at = {id(s): i for i, s in enumerate(plan.steps)}

    def cell(s):
        return int(s.where.split()[1].rstrip(",")) if s.where.startswith("cell ") else None

    setup = [at[id(s)] for s in steps(plan, "setup")]
    work = [s for s in plan.steps if s.kind in ("gpu", "cpu") and s.op]
    imports = [s for s in plan.steps if s.kind in ("import", "framework") and not s.first_use and not s.overlap]
    early = [s for s in imports if first_gpu is None or cell(s) is None or cell(s) <= first_gpu or s.framework]
    later = [s for s in imports if s not in early]
    assert not setup or max(setup) < min(at[id(s)] for s in plan.steps if s.kind != "setup")
    if work:
        assert max((at[id(s)] for s in early), default=-1) < min(at[id(s)] for s in work), plan.lines()
        assert min((at[id(s)] for s in later), default=len(plan.steps)) > max(at[id(s)] for s in work), plan.lines()
    first_work = [at[id(s)] for s in work if s.op in ("cuda_init", "alloc", "elementwise", "matmul_fp32")]
    training = [at[id(s)] for s in work if s.op in ("backward", "optimizer", "grad_scaler")]
    init = [at[id(s)] for s in work if s.op == "cuda_init"]
    if init:
        assert init[0] == min(at[id(s)] for s in work if s.kind == "gpu"), plan.lines()
    if first_work and training:
        assert max(first_work) < min(training), plan.lines()
    if any(s.op == "optimizer" for s in work):
        dynamo = next(s for s in plan.steps if s.module == "torch._dynamo")
        torch = next(s for s in plan.steps if s.module == "torch" or s.module.startswith("torch."))
        assert dynamo.overlap and at[id(dynamo)] == at[id(torch)] + 1, plan.lines()
