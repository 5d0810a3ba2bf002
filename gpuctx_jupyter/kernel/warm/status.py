"""What the warm-up did, as `%gpu status` and the kernel view report it: its state, the phases
with their times, and how long the user's first cell waited for it (scheduler.py keeps one)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WarmState:
    state: str = "off"  # off | running | done | skipped | failed
    detail: str = ""  # what it did, or why it skipped or failed
    source: str = ""  # server hook, kernel config, %gpu warm
    device: int | None = None
    phase: str = ""  # the phase running now
    phases: dict[str, float] = field(default_factory=dict)  # seconds each
    started: float | None = None  # time.monotonic()
    finished: float | None = None
    first_cell_overlap: float | None = None  # how long the first cell ran while warm-up was busy
    after_cells: bool = False  # started after cells of the user's had run (typed cells): not "your first cell"
    cell_waits: str = ""  # the warm-up's import that the cell starting now waits for (it may need it)

    @property
    def total(self) -> float | None:
        return None if self.started is None or self.finished is None else self.finished - self.started

    def summary(self) -> str:
        phases = ", ".join(f"{k} {v:.2f} s" for k, v in list(self.phases.items()))  # (grows in other threads)
        where = f" on cuda:{self.device}" if self.device is not None else ""
        by = f", started by {self.source}" if self.source else ""
        if self.state == "running":
            waits = "; your cell waits for it to finish" if self.cell_waits else ""
            return f"running{where} (now: {self.phase}{waits}; done: {phases or 'nothing yet'}){by}"
        if self.state == "off":
            return f"off ({self.detail})" if self.detail else "off"
        text = f"{self.state}{where}"
        if self.total is not None and self.state != "skipped":
            text += f" in {self.total:.2f} s"
        if phases:
            text += f" ({phases})"
        if self.detail:
            text += f": {self.detail}" if self.state in ("skipped", "failed") else f"; {self.detail}"
        text += by
        if self.first_cell_overlap is not None:
            who = "the first cell beside it" if self.after_cells else "your first cell"
            text += f"; {who} waited for it at most {self.first_cell_overlap:.2f} s"
        return text

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["phases"], d["total"] = dict(list(self.phases.items())), self.total
        return d
