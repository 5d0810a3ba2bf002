"""Where a plan's GPU work goes: whether any is done here (and why not), and on which devices —
the notebook's, else the kernel's — each batch of it handed to the frameworks' recipes there."""
from __future__ import annotations

from ...core import cuda_driver
from ...core import frameworks as fws
from .plan import Plan, Step
from .recipes import RECIPES, recipe


def why_no_gpu_work(plan: Plan, imported, turn) -> tuple[str | None, bool]:
    """Why no GPU work is done here (None: go ahead), and whether it only waits for the notebook's
    own set-up or device line (plan.gpu_blocked) on a machine with a GPU — NVML says so without
    starting CUDA, which would read the setting too early. `turn(step, heavy)` waits for the
    check's turn."""
    names = ", ".join(dict.fromkeys(imported)) or "nothing"
    if not plan.gpu:  # (a plan that imports only: no GPU work, whatever its steps)
        return f"imported {names} only; {plan.gpu_blocked or 'this plan does no GPU work'}", False
    turn(Step("gpu", "the GPU check"), heavy=False)  # (asking torch holds the GIL a while)
    from ...core import inventory  # (in the warm-up's thread, after readiness: not at load)

    why = inventory.take().no_gpu_reason()
    if why:
        return f"imported {names} only; no GPU is visible: {why}", False
    if plan.gpu_blocked:
        return f"imported {names} only; {plan.gpu_blocked}", True
    if "torch" in plan.frameworks and "torch" in imported:
        cuda_driver.init()  # what asking torch starts, without the GIL (the kernel's thread runs on)
        reason = fws.TORCH.gpu_reason()
        if reason:
            return f"imported {names} only; {reason}", False
    return None, False


def without_framework(steps: list[Step]) -> list[Step]:
    """`steps` less those whose framework's import has not completed (failed, skipped for the
    budget, or left running past it), marked skipped: their recipes would import it themselves,
    past the import budget and outside the cells' turns (or wait on its import lock for good)."""
    for s in steps:
        fw = fws.BY_NAME.get(s.framework)  # (its package: numba.cuda is the Numba recipe's own import)
        if fw is not None and s.state == "planned" and not fws.imported(fw.package):
            s.state, s.detail = "skipped", f"import {fw.package} did not complete"
    return [s for s in steps if s.state == "planned"]


def devices_of(plan: Plan, device, switcher) -> list[int]:
    """CUDA ordinals to warm: those the notebook names, else `device`, else the kernel's choice.
    What the notebook names wins over the server's assignment: the kernel is started on it."""
    ordinals = []
    if plan.devices:
        from ...core import inventory
        from ...core.devices import SpecError, parse_spec

        devices = inventory.take().devices
        for spec in plan.devices:
            if spec.strip().lower() == "auto":
                plan.notes.append("`%gpu use auto` picks its device when it runs: the kernel's device is warmed")
                continue
            try:
                ordinal = parse_spec(spec, devices).ordinal
            except SpecError as exc:
                plan.notes.append(f"device {spec!r} named by the notebook: {exc}")
                continue
            if ordinal not in ordinals:
                ordinals.append(ordinal)
    if ordinals:
        _follow_notebook(plan, ordinals[0], switcher)
        return ordinals
    if device is None:
        device = switcher.base.ordinal if switcher and switcher.base else 0  # (not a %%on_gpu block's)
    return [device]


def _follow_notebook(plan: Plan, ordinal: int, switcher) -> None:
    if switcher is None or (switcher.base is not None and switcher.base.ordinal == ordinal):
        return
    if switcher.base is None or switcher.base.assigned:
        from ..switching import Choice

        switcher.use(Choice(ordinal, source=f"the notebook ({plan.device_where})"))


def gpu_batch(warmer, plan: Plan, ordinals: list[int], steps: list[Step]) -> None:
    """One batch of `warmer`'s GPU work, by each framework's recipe, on each of `ordinals` (the
    devices the notebook uses: devices_of)."""
    names = [s.name for s in steps]  # as planned: a recipe may name the first device in them
    for i, ordinal in enumerate(ordinals):
        batch = steps
        if i:  # another device: the same work again, shown as its own steps
            batch = [Step(s.kind, f"{name} on cuda:{ordinal}", where=s.where, code=s.code, op=s.op,
                          framework=s.framework, names=s.names, ordinal=ordinal) for s, name in zip(steps, names)]
            plan.steps += batch
        for fw in RECIPES:
            mine = [s for s in batch if s.framework == fw]
            if mine:
                recipe(fw).gpu(warmer, mine, ordinal)


def cpu_batch(warmer, plan: Plan, steps: list[Step]) -> None:
    """No GPU: what each framework's recipe still does on the CPU."""
    for fw in RECIPES:
        mine = [s for s in steps if s.framework == fw and s.state == "planned"]
        if mine:
            recipe(fw).cpu(warmer, mine)
