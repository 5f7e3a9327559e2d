"""What an Adam state read from a file must hold before a run continues it: a step count the trainers can
count from, finite first moments, finite non-negative second moments. Every reader of optimizer state
(``vit_torch.formats.read_timm_optimizer``) passes its values here, so a damaged or hostile state is
refused naming the file and the tensor, never trained on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

# optax counts Adam's steps in int32 (``optax.safe_int32_increment`` stops there), and so does the JAX
# twin's train state: a larger count cannot be continued.
MAX_STEP = 2**31 - 1


def adam_step(source: str, value) -> int:
    """``value`` (a Python or numpy scalar, or a one-element array: torch keeps Adam's step as a float
    tensor) as the whole number of steps taken.

    Raises:
        ValueError: not a number, not finite, not whole, or outside [0, ``MAX_STEP``], naming ``source``.
    """
    try:
        step = float(np.asarray(value, dtype=np.float64).reshape(()))
    except (TypeError, ValueError):
        raise ValueError(f"{source}: Adam step {value!r}: expected a whole number of steps") from None
    if not (math.isfinite(step) and step == int(step) and 0 <= step <= MAX_STEP):
        raise ValueError(f"{source}: Adam step {step:g}: expected a whole number in [0, {MAX_STEP}]")
    return int(step)


def check_adam_values(source: str, mu: Mapping[str, np.ndarray], nu: Mapping[str, np.ndarray]) -> None:
    """Refuse a first moment that is not finite, or a second moment that is not finite or is negative
    (a running mean of squared gradients never is; its square root divides the update).

    Raises:
        ValueError: one line naming ``source``, the moment (``exp_avg`` / ``exp_avg_sq``), the tensor, the
            count of bad values and one of them.
    """
    for what, table, negative_ok in (("exp_avg", mu, True), ("exp_avg_sq", nu, False)):
        for name, value in table.items():
            arr = np.asarray(value)
            with np.errstate(invalid="ignore"):  # NaN < 0 is False, and counted as not finite
                bad = ~np.isfinite(arr) if negative_ok else ~np.isfinite(arr) | (arr < 0)
            if bad.any():
                expected = "finite values" if negative_ok else "finite values >= 0"
                raise ValueError(
                    f"{source}: {what} of {name!r} holds {int(bad.sum())} bad value(s) (e.g. "
                    f"{arr[bad].flat[0]}): expected {expected}"
                )
