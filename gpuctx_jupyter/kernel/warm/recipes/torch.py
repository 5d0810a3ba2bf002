"""Warming PyTorch: what first cells run, so that each op's kernels are loaded (CUDA loads them
lazily, process-wide) and the library handles exist in torch's pools, where the user's thread
takes them from once this thread has exited."""
from __future__ import annotations

import functools
import os
import sys

from ....contract import INDUCTOR_MODULE, STANDBY
from ....core import cuda_driver
from ....core.frameworks import imported
from .. import attention, compile_guard
from ..plan import Step
from . import inductor

# Ops after which this thread holds cuBLAS/cuDNN handles of its own: while it lives, a user's
# thread doing the same gets a second set (~100 MiB); once it exits, they go back to torch's pools.
HANDLE_OPS = {"matmul_fp32", "matmul_bf16", "matmul_fp16", "conv", "conv_bf16", "attention", "autocast", "backward",
              "grad_scaler", "optimizer", "attention_shapes"}


class TorchRecipe:
    framework = "torch"

    def gpu(self, run, steps: list[Step], ordinal: int) -> None:
        import torch

        dev = torch.device("cuda", ordinal)
        ops = {s.op for s in steps}
        work, tensors = _work(torch, dev, ops)
        cells_before = run.cells_started
        # Blocks cached before this batch are the user's (an earlier warm-up emptied its own): a
        # later plan (typed cells) leaves them where the user's next cell will find them.
        users_cache = torch.cuda.is_initialized() and torch.cuda.memory_reserved(dev) > 0
        try:
            for step in steps:
                if step.state != "planned":
                    continue
                if step.op == "optimizer":
                    self._dynamo(run, step)
                    if run.user_gpu:  # the import was CPU work; the step itself is GPU work
                        step.state, step.detail = "skipped", "your own GPU cell started first"
                        continue
                    low = low_precision(torch, ops)
                    if low:
                        step.name += f", also in {' and '.join(str(d).split('.')[-1] for d in low)}"
                    run.phase(step, functools.partial(train_step, torch, dev, step.names or ("adamw", "sgd"), low),
                              heavy=True, handles=True)
                elif step.op == "compile":
                    self._dynamo(run, step)
                    workers = _workers_step(run, step, torch)
                    if workers is not None:  # started first: ready sooner, and at the kernel's own priority
                        run.unniced(inductor.start_pool)
                    compiled = run.phase(step, functools.partial(compile_tiny, torch, dev), heavy=True, handles=True)
                    if workers is not None:
                        _through_workers(run, workers, torch, dev, compiled)
                elif step.op == "attention_shapes":
                    _notebook_attention(run, step, torch, dev)
                elif step.op in work:
                    if step.op != "cuda_init" and not torch.cuda.is_initialized():
                        step.state, step.detail = "skipped", "CUDA did not start"
                        continue
                    run.phase(step, work[step.op], handles=step.op in HANDLE_OPS)
                else:
                    step.state, step.detail = "skipped", f"unknown op {step.op!r}"
            if torch.cuda.is_initialized() and not run.user_gpu:
                run.phase(Step("gpu", "sync"), lambda: torch.cuda.synchronize(dev))
        finally:  # also when cut short: leave the allocator as a cold kernel would have it —
            tensors.clear()  # but never return blocks a cell of the user's has cached meanwhile
            if torch.cuda.is_initialized() and not users_cache:
                run.unless_cells_since(cells_before, functools.partial(_release, torch))

    def cpu(self, run, steps: list[Step]) -> None:
        """No GPU: what still helps on the CPU — the optimizer's torch._dynamo import and one
        training step (autograd and the optimizers' first use), and a tiny compile (inductor's CPU
        backend: its import, codegen and C++ toolchain's first use); in a standby whose import
        profile has torch.compile's import, inductor's compile workers, started and given their
        first jobs (no CUDA)."""
        for step in steps:
            if step.op == "compile_pool" and step.state == "planned":
                _pool_ahead(run, step)
            if step.op not in ("optimizer", "compile") or step.state != "planned":
                continue
            if "torch" not in sys.modules:
                step.state = "skipped"
                continue
            import torch

            self._dynamo(run, step)
            step.name = f"{step.name} on the CPU"
            cpu = torch.device("cpu")
            work = (functools.partial(train_step, torch, cpu, step.names or ("adamw", "sgd")) if step.op == "optimizer"
                    else functools.partial(compile_tiny, torch, cpu))
            run.phase(step, work, heavy=True)

    @staticmethod
    def _dynamo(run, step: Step) -> None:
        """What an optimizer's first use imports (~3 s of CPU), as a step of its own before it
        (the plan imports it in the background from the moment torch is imported: wait for that)."""
        run.wait_background()
        if "torch._dynamo" in sys.modules:
            return
        dyn = Step("cpu", "import torch._dynamo", where=step.where, code=step.code, module="torch._dynamo",
                   detail="what an optimizer's first use imports")
        run.plan.steps.insert(run.plan.steps.index(step), dyn)
        run.import_module(dyn)


RECIPE = TorchRecipe()


def _work(torch, dev, ops: set[str]) -> tuple[dict, dict]:
    """The ops as functions, and the tensors they share (cleared when the warm-up ends)."""
    import torch.nn.functional as F

    t: dict = {}

    def xy():
        if "x" not in t:
            t["x"], t["y"] = torch.randn(1024, 1024, device=dev), torch.rand(1024, 1024, device=dev)
        return t["x"], t["y"]

    def cuda_init():
        if not torch.cuda.is_initialized():
            retained = cuda_driver.start(dev.index)  # the driver and the context, without holding the GIL
            try:
                torch.cuda.init()
            except BaseException:
                if retained and not torch.cuda.is_initialized():
                    cuda_driver.release(dev.index)
                raise
        torch.cuda.set_device(dev)

    def alloc():
        t["x"] = torch.randn(1024, 1024, device=dev)
        t["y"] = torch.rand(1024, 1024, device=dev)
        torch.zeros(16, device=dev), torch.ones(16, device=dev), torch.arange(16, device=dev)
        torch.tensor([1.0, 2.0]).to(dev)

    def elementwise():
        x, y = xy()
        z = torch.relu((x + y) * 2 - 1)
        z.sum().item(), z.mean().item(), z.max().item(), z.argmax().item()
        torch.softmax(z, dim=-1), torch.exp(z).cpu()
        h = torch.randn(8, 64, device=dev)
        F.gelu(h), F.layer_norm(h, (64,)), F.dropout(h, 0.1, training=True), torch.cat([h, h])
        F.cross_entropy(h, torch.zeros(8, dtype=torch.long, device=dev)).item()
        F.mse_loss(h, h).item()
        F.embedding(torch.zeros(4, dtype=torch.long, device=dev), torch.randn(10, 64, device=dev))

    def matmul(dtype):
        def run():
            x, y = xy()
            (x.to(dtype) @ y.to(dtype)).float().sum().item()
            F.linear(x[:64].to(dtype), y[:32].to(dtype), torch.zeros(32, device=dev, dtype=dtype)).sum().item()
        return run

    def conv(dtypes):
        def run():
            img, weight = torch.randn(8, 3, 64, 64, device=dev), torch.randn(16, 3, 3, 3, device=dev)
            for dtype in dtypes:
                out = F.conv2d(img.to(dtype), weight.to(dtype), padding=1)
                out = F.batch_norm(out, None, None, torch.ones(16, device=dev, dtype=dtype),
                                   torch.zeros(16, device=dev, dtype=dtype), training=True)
                F.adaptive_avg_pool2d(F.max_pool2d(F.relu(out), 2), 1).float().sum().item()
        return run

    def attention():
        for dtype in (torch.float32, torch.bfloat16) if "matmul_bf16" in ops or "autocast" in ops else (
                torch.float32,):
            q = torch.randn(2, 4, 64, 32, device=dev, dtype=dtype, requires_grad="backward" in ops)
            out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            if q.requires_grad:
                out.float().sum().backward()
            out.float().sum().item()

    def autocast():
        dtypes = [d for d, op in ((torch.bfloat16, "matmul_bf16"), (torch.float16, "matmul_fp16")) if op in ops]
        for dtype in dtypes or [torch.bfloat16]:
            with torch.autocast("cuda", dtype=dtype):
                x, y = xy()
                (x @ y).float().sum().item()
                if "conv" in ops:
                    conv((torch.float32,))()

    def backward():
        net = tiny_net(torch, "conv" in ops).to(dev)
        loss = F.cross_entropy(net(torch.randn(4, 3, 16, 16, device=dev)), torch.zeros(4, dtype=torch.long,
                                                                                     device=dev))
        loss.backward()

    def grad_scaler():
        net = tiny_net(torch, "conv" in ops).to(dev)
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(net(torch.randn(4, 3, 16, 16, device=dev)),
                                   torch.zeros(4, dtype=torch.long, device=dev))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    work = {"cuda_init": cuda_init, "alloc": alloc, "elementwise": elementwise,
            "matmul_fp32": matmul(torch.float32), "matmul_bf16": matmul(torch.bfloat16),
            "matmul_fp16": matmul(torch.float16), "conv": conv((torch.float32, torch.float16)),
            "conv_bf16": conv((torch.bfloat16,)), "attention": attention, "autocast": autocast,
            "backward": backward, "grad_scaler": grad_scaler}
    return work, t


def _notebook_attention(run, step: Step, torch, dev) -> None:
    """The attention problems noted on the notebook's last run (warm/attention.py): forward and
    backward here (the backward's graphs live in autograd's thread, which every thread shares),
    then each forward again in the cells' thread, where its graph is kept, once this one has exited."""
    if not torch.cuda.is_initialized():
        step.state, step.detail = "skipped", "CUDA did not start"
        return
    problems, left = attention.fitting(torch, dev, attention.remembered(run.plan.notebook))
    step.detail = left
    if not problems:
        step.state, step.detail = "skipped", left or "its record is gone"
        return
    there = [Step("cells", f"its forward in the cells' thread ({attention.describe(p)})", where=step.where,
                  op="attention_cells", framework="torch",
                  detail="kept per thread: once this warm-up has exited, while no cell runs") for p in problems]
    at = run.plan.steps.index(step) + 1
    run.plan.steps[at:at] = there

    def build():
        for problem in problems:  # (a GPU cell of the user's meanwhile: the rest is left to it)
            if not run.user_gpu:
                attention.run(torch, dev, problem, backward=True)

    ran = run.phase(step, build, handles=True) and not run.user_gpu
    for later, problem in zip(there, problems):
        if ran:
            run.in_cells_thread(later, attention.in_cells_thread(torch, dev, problem),
                                ready=lambda p=problem: attention.fitting(torch, dev, [p])[1])
        elif later.state == "planned":
            later.state, later.detail = "skipped", step.detail or "the warm-up's own run of it did not happen"


def tiny_net(torch, conv: bool):
    nn = torch.nn
    if conv:
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                             nn.Linear(8 * 16 * 16, 10))
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 32), nn.ReLU(), nn.Linear(32, 10))


def low_precision(torch, ops: set[str]) -> tuple:
    """The dtypes of a model kept in bf16 or fp16 (`.to(dtype=torch.bfloat16)`: its matmuls in that
    dtype, no autocast, which keeps parameters in fp32)."""
    if "autocast" in ops or "grad_scaler" in ops:
        return ()
    return tuple(d for d, op in ((torch.bfloat16, "matmul_bf16"), (torch.float16, "matmul_fp16")) if op in ops)


def train_step(torch, dev, optimizers, low: tuple = ()) -> None:
    """One forward, backward and optimizer step per optimizer on a tiny model: autograd's engine,
    the optimizers' first use (torch._dynamo, foreach kernels) and zero_grad; then the same on a
    tiny block in each dtype of `low` (low_precision_step)."""
    import torch.nn.functional as F

    for name in optimizers:
        net = tiny_net(torch, False).to(dev)
        opt = (torch.optim.AdamW(net.parameters(), lr=1e-3) if name == "adamw"
               else torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9))
        for _ in range(2):  # the second step uses the optimizer's state
            loss = F.cross_entropy(net(torch.randn(4, 3, 16, 16, device=dev)),
                                   torch.zeros(4, dtype=torch.long, device=dev))
            opt.zero_grad()
            loss.backward()
            opt.step()
        float(loss.detach())
    for dtype in low:
        low_precision_step(torch, dev, dtype, optimizers)


def low_precision_step(torch, dev, dtype, optimizers) -> list:
    """A training step of a model whose parameters are bf16 (or fp16): LayerNorm, attention, GELU
    and the optimizer in that dtype launch kernels of their own, which the fp32 step never loads
    (each costs its first launch: 0.2 s of a bf16 transformer's first step on an H200)."""
    import torch.nn.functional as F

    nn = torch.nn
    norm, qkv = nn.LayerNorm(32), nn.Linear(32, 96)
    mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
    for module in (norm, qkv, mlp):
        module.to(device=dev, dtype=dtype)
    params = [p for module in (norm, qkv, mlp) for p in module.parameters()]
    x = torch.randn(2, 16, 32, device=dev, dtype=dtype)
    for name in optimizers:
        opt = (torch.optim.AdamW(params, lr=1e-4) if name == "adamw"
               else torch.optim.SGD(params, lr=0.01, momentum=0.9))
        for _ in range(2):
            q, k, v = qkv(norm(x)).view(2, 16, 3, 4, 8).transpose(1, 3).unbind(2)
            h = x + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 16, 32)
            loss = (h + mlp(norm(h))).float().pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        float(loss.detach())
    return params  # (the tests look at them)


def compile_tiny(torch, dev) -> None:
    """torch.compile's first use: dynamo, inductor's import and code generation, its compile
    workers, a forward and a backward graph (the user's own model then compiles in a fraction of
    the cold time; inductor's caches on disk keep what it generated).

    It compiles a function of its own, never an nn.Module: dynamo keeps what it saw per code
    object, so a warm-up through nn.Sequential.forward made the user's first nn.Sequential compile
    with a dynamic batch size (automatic dynamic shapes) — a different graph, slower to build,
    that missed the on-disk cache the same notebook had filled the day before. The function calls
    a model as notebooks build one (nn.Linear with its bias, nn.GELU, nn.Parameter inputs) 257
    wide, a width matmuls are not aligned to: what a model's first compile pays once per process
    (dynamo's first trace of those modules, fake parameters, the first op lookups, pad_mm's first
    benchmark and the device's peak rates it reads through nvidia-smi) is paid here, about 0.2 s
    of a never-seen graph's first compile on an H200 (docs/benchmarks.md, ninth run)."""
    nn = torch.nn
    with compile_guard.compiling():  # dynamo puts back settings a cell may set meanwhile
        net = nn.Sequential(nn.Linear(256, 257), nn.GELU(), nn.Linear(257, 8)).to(dev)
        fn = torch.compile(_tiny_net)
        x = torch.randn(64, 256, device=dev)
        fn(x, net).backward()
        float(fn(x, net).detach())


def _workers_step(run, step: Step, torch) -> Step | None:
    """The step that compiles through inductor's workers, placed after the compile step (its own
    `op`, so that a re-plan knows it as done); None where compiles use no workers (the reason goes
    into the compile step's detail)."""
    why = inductor.why_not(torch)
    if why:
        step.detail = f"compile workers: {why}"
        return None
    workers = Step("gpu", "compile through inductor's workers", where=step.where, code=step.code,
                   framework="torch", op="compile_workers", detail="once they are ready; kept 10 min after their last job")
    run.plan.steps.insert(run.plan.steps.index(step) + 1, workers)
    return workers


def _through_workers(run, step: Step, torch, dev, compiled: bool) -> None:
    """Once the workers take jobs, a compile through them; then they are kept (recipes/inductor.py)."""
    try:
        why = inductor.wait_ready(lambda: run.user_gpu) if compiled else "the tiny compile did not run"
    except Exception as exc:  # noqa: BLE001 — torch's pool refused: the notebook's compile finds out itself
        why = f"{type(exc).__name__}: {exc}"
    if why:
        step.state, step.detail = "skipped", why
    elif run.phase(step, functools.partial(_compile_through, step, torch, dev), heavy=True):
        inductor.hold(standby=bool(os.environ.get(STANDBY)))


def _pool_ahead(run, step: Step) -> None:
    """A standby's: inductor's workers ready, and each one's first jobs run, before a notebook
    compiles (they take 5-10 s to start: on an H200 host a notebook read for 10 s compiled before
    they were ready); kept while the standby waits. No CUDA: the architectures come from NVML.
    Skipped, saying why, where it cannot be done; it stops waiting once a notebook takes the
    standby (whose own warm-up then starts the workers itself)."""
    if not imported(INDUCTOR_MODULE):
        step.state, step.detail = "skipped", f"{INDUCTOR_MODULE} was not imported"
        return
    adopted = lambda: not os.environ.get(STANDBY)  # noqa: E731
    try:
        why = inductor.why_not(sys.modules["torch"])
        if not why:
            run.unniced(inductor.start_pool)
            why = inductor.wait_ready(adopted, gave_up="a notebook took this standby first")
    except Exception as exc:  # noqa: BLE001 — torch's pool refused: a standby's extra never fails its warm-up
        why = f"{type(exc).__name__}: {exc}"
    if why:
        step.state, step.detail = "skipped", why
        return

    def first_jobs() -> None:
        inductor.hold(standby=not adopted())
        step.detail = f"no CUDA; {_first_jobs(inductor.visible_archs)}; kept while this standby waits"

    run.phase(step, first_jobs)


def _first_jobs(archs) -> str:
    """inductor.first_jobs for the architectures `archs()` names, or why they failed (the workers
    serve compiles all the same)."""
    try:
        return inductor.first_jobs(archs())
    except Exception as exc:  # noqa: BLE001
        last = (str(exc).strip().splitlines() or [""])[-1][:200]  # a worker's error ends its traceback
        return f"their first jobs failed ({type(exc).__name__}: {last})"


def _compile_through(step: Step, torch, dev) -> None:
    jobs = _first_jobs(lambda: {inductor.arch_of(torch, dev)})
    with compile_guard.compiling():
        inductor.through_workers(torch, dev)
    step.detail = f"{jobs}; kept 10 min after their last job"


def _release(torch) -> None:
    """Give back what the warm-up cached: the allocator's free blocks and cuBLAS's workspaces (one
    per handle and stream, 32 MiB each on Hopper; a cell of the user's allocates its own on its
    first matmul, as in a cold kernel — kept, they made a compiled notebook's GPU memory 3-6% over cold)."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()


def _tiny_net(x, net):
    """The warm-up's compiled function: its code object is gpuctx's alone (see compile_tiny)."""
    return net(x).relu().sum()
