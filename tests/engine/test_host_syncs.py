"""Between two log steps the loop reads the device exactly once: loss, grad norm and the non-finite
guard stay tensors until the sync point. On CPU a read is cheap, but every read in the step is a
place where a GPU queue would drain, so the count is what matters and what is checked here."""

from __future__ import annotations

import pytest
import torch

from lehr.engine.run import loop
from lehr.engine.run.metrics import RunLog
from tests import faults

# Every Python-level way a tensor's value reaches the host.
READS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")


@pytest.mark.parametrize("fault_steps", [(), (13,)])
def test_one_device_read_per_logged_step(tiny_config, monkeypatch, fault_steps):
    faults.nonfinite_at(monkeypatch, fault_steps)  # a skipped step must not add a read either
    events = []
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            events.append("read")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    original_step = RunLog.log_step

    def logged(self, rec):
        events.append(("log", rec["step"]))
        original_step(self, rec)

    monkeypatch.setattr(RunLog, "log_step", logged)
    summary = loop.train(tiny_config(planned_steps=30, log_every=10, eval_every=1000, ckpt_every=1000))

    assert summary["skips_total"] == (1 if fault_steps else 0)
    logs = [i for i, e in enumerate(events) if isinstance(e, tuple)]
    assert [events[i][1] for i in logs] == [10, 20, 30]
    between = [events[a + 1 : b].count("read") for a, b in zip(logs, logs[1:], strict=False)]
    assert between == [1, 1]
