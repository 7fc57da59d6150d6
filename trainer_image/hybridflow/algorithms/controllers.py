"""KL coefficient controllers for the KL-in-reward penalty (``algorithm.kl_ctrl``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._compat import cfg_get

KL_CTRL_TYPES: tuple[str, ...] = ("fixed", "adaptive")


class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Do nothing: the coefficient is fixed."""

    def state_dict(self) -> dict[str, float]:
        """The state to checkpoint."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore from ``state_dict()``."""
        self.value = float(state["value"])


class AdaptiveKLController(FixedKLController):
    """Proportional controller that steers the observed KL towards ``target_kl``."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        super().__init__(init_kl_coef)
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(
                f"Adaptive KL control needs target_kl > 0 and horizon > 0, got target_kl={target_kl}, "
                f"horizon={horizon}; fix algorithm.kl_ctrl.target_kl / algorithm.kl_ctrl.horizon."
            )
        self.target = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Scale the coefficient by ``1 + clip(KL/target - 1, -0.2, 0.2) * n_steps / horizon``."""
        # Ziegler et al. 2019 (arXiv 1909.08593), section 2.2: e_t = clip(KL/KL_target - 1, -0.2, 0.2),
        # beta_{t+1} = beta_t (1 + K_beta e_t) with K_beta = n_steps / horizon.
        error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + error * n_steps / self.horizon


def get_kl_controller(kl_ctrl: Any) -> FixedKLController:
    """Build the controller described by ``kl_ctrl`` (fields ``type``, ``kl_coef``, ``target_kl``, ``horizon``)."""
    kind = cfg_get(kl_ctrl, "type", "fixed")
    kl_coef = float(cfg_get(kl_ctrl, "kl_coef", 0.001))
    if kind == "fixed":
        return FixedKLController(kl_coef=kl_coef)
    if kind == "adaptive":
        return AdaptiveKLController(
            init_kl_coef=kl_coef,
            target_kl=float(cfg_get(kl_ctrl, "target_kl", 0.1)),
            horizon=int(cfg_get(kl_ctrl, "horizon", 10000)),
        )
    raise ValueError(f"Unknown KL controller type {kind!r}; set algorithm.kl_ctrl.type to 'fixed' or 'adaptive'.")
