"""Research prefill modes, registered into the product's registry (workers/modes.py).

    shift    reuse, with every stored chunk entry shifted first by the model's context drift
             (workers/context_drift.py): reuse's cost; on the quality suite's `dev` split 0.594 against
             reuse's 0.458 (blend at 15%: 0.667; research/blend.md "The shift mode")
"""

from __future__ import annotations

from workers.blend import BlendConfig
from workers.modes import PrefillPlan, prefill_mode


@prefill_mode("shift")
def shift(setting: BlendConfig) -> PrefillPlan:
    return PrefillPlan("shift", shift=True)
