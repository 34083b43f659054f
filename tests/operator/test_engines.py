"""What the operator pushes to an engine, and when it does not need to: an engine is in step
when it runs its own SKU's threshold, the base share and the lease."""

from __future__ import annotations

from spectune.operator.engines import in_step
from spectune.operator.tuning import Target

from .machine import H100, L4

TARGET = Target("e-0", "http://127.0.0.5:8000", 16, {H100: 48, L4: None}, 0.02, None)


def test_an_engine_is_in_step_on_its_own_skus_threshold() -> None:
    live = {"threshold": 48, "exploration": 0.02, "lease": None, "device": H100}
    assert in_step(live, TARGET)
    assert not in_step(live | {"device": L4}, TARGET)  # an L4 engine runs None
    assert in_step(live | {"device": L4, "threshold": None}, TARGET)
    assert in_step(live | {"device": "cpu", "threshold": 16}, TARGET)  # no entry: the default
    assert not in_step(live | {"exploration": 0.5}, TARGET)
    lease = {"exploration": 0.5, "until": 2e9, "below": None}
    assert not in_step(live, Target(**{**TARGET.__dict__, "lease": lease}))
