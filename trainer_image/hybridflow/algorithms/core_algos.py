"""Alias of ``hybridflow.algorithms`` laid out like ``verl.trainer.ppo.core_algos`` for ported code.

``import hybridflow.algorithms.core_algos as core_algos`` then ``core_algos.register_adv_est``,
``core_algos.compute_policy_loss_vanilla``, ``core_algos.kl_penalty`` ... work as in verl.
The registries are shared: registering through this module registers for the trainer too.
"""

from . import *  # noqa: F403
from . import __all__ as _all

__all__ = list(_all)
