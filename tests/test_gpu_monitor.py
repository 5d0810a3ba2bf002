"""The live monitor on a real GPU (marked `gpu`)."""
from __future__ import annotations

import html
import json
import re

import pytest

from .harness.kernels import run, start, stop

pytestmark = pytest.mark.gpu


def memory_meter(meters_html: str) -> str:
    """The text a screen reader gets for a card's memory bar (its role="meter"): "used / total"."""
    found = re.search(r"role='meter' aria-label='memory of [^']*'.*?aria-valuetext='([^']*)'", meters_html)
    assert found, meters_html
    return html.unescape(found.group(1))


def test_real_samples_and_this_kernel_marked_while_it_holds_memory():
    km, kc = start()
    try:
        r = run(kc, "%load_ext gpuctx\nimport torch, time, json\n"
                    "x = torch.ones(256, 1024, 1024, device='cuda:0')\n"
                    "m = %gpu monitor 0 --interval 0.2\ntime.sleep(1.5)")
        assert r.reply["status"] == "ok", r.stderr
        r = run(kc, "card = next(iter(m.cards.values()))\n"
                    "print(json.dumps({'title': card.title.value, 'procs': card.procs.value, "
                    "'numbers': card.numbers.value, 'meters': card.meters.value, 'svg': card.plot.value}))")
        assert r.reply["status"] == "ok", r.stderr
        view = json.loads(r.stdout.strip().splitlines()[-1])
        assert "cuda:0" in view["title"] and "error" not in view["title"]
        used, total = memory_meter(view["meters"]).split(" / ")  # the memory bar's text: NVML's real figures
        assert total.endswith(" GiB") and float(total.split()[0]) > 40  # (an H100: 79.6, an H200: 140)
        assert used.endswith(" GiB") and float(used.split()[0]) >= 1
        assert "◀ this kernel" in view["procs"]
        assert "torch: allocated 1.00 GiB" in view["numbers"]
        assert "<polyline" in view["svg"]
        r = run(kc, "m.close(); time.sleep(0.5)\nimport threading\n"
                    "print([t.name for t in threading.enumerate() if t.name == 'gpuctx-sampler'])")
        assert r.stdout.strip() == "[]"
    finally:
        stop(km, kc)
