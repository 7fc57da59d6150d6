"""DAPO overlong shaping and group filtering; KL controllers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hybridflow.algorithms import (
    AdaptiveKLController,
    FixedKLController,
    compute_overlong_penalty,
    filter_groups,
    get_kl_controller,
)


@pytest.mark.parametrize(
    ("length", "expected"),
    [(0, 0.0), (80, 0.0), (81, -0.05), (90, -0.5), (100, -1.0), (120, -1.0)],
)
def test_overlong_penalty_is_linear_inside_the_buffer(length: int, expected: float) -> None:
    # L_max = 100, buffer 20: free up to 80 tokens, then -1/20 per token, -1 at L_max (DAPO eq. 13).
    got = compute_overlong_penalty([length], max_response_length=100, overlong_buffer_len=20, penalty_factor=1.0)
    assert got.tolist() == pytest.approx([expected])


def test_overlong_penalty_scales_with_factor_and_accepts_tensors() -> None:
    got = compute_overlong_penalty(torch.tensor([50, 90, 100]), 100, 20, penalty_factor=0.5)
    torch.testing.assert_close(got, torch.tensor([0.0, -0.25, -0.5]))


@pytest.mark.parametrize("buffer_len", [0, -5, 101])
def test_overlong_penalty_rejects_bad_buffer(buffer_len: int) -> None:
    with pytest.raises(ValueError, match="overlong_buffer_len=.* must be in \\(0, max_response_length=100\\]"):
        compute_overlong_penalty([10], 100, buffer_len)


def test_filter_groups_drops_zero_variance_groups() -> None:
    index = np.array(["p", "q", "p", "r", "q", "s", "s"], dtype=object)
    acc = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0]  # p mixed, q all wrong, r alone, s all right
    mask, uids = filter_groups(index, acc)
    assert uids == ["p", "r"]  # singletons are kept, as in verl's DAPO trainer
    assert mask.tolist() == [True, False, True, True, False, False, False]
    mask_t, _ = filter_groups(index, torch.tensor(acc))
    assert mask_t.tolist() == mask.tolist()
    with pytest.raises(ValueError, match="7 group ids but 2 metric values"):
        filter_groups(index, [1.0, 0.0])


def test_filter_groups_judges_a_group_by_its_finished_rows() -> None:
    """Over-sampling cuts slow trajectories (score 0 on an unfinished response): they ride along with their group
    but must not make an all-right group look informative, nor keep a group with nothing finished."""
    index = np.array(["p", "p", "p", "q", "q", "r", "s", "s"], dtype=object)
    acc = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    cut = np.array([False, False, True, False, False, True, False, True])
    mask, uids = filter_groups(index, acc, ignore=cut)
    assert uids == ["q", "s"]  # p: all finished right; r: nothing finished; s: one finished (a singleton)
    assert mask.tolist() == [False, False, False, True, True, False, True, True]
    assert filter_groups(index, acc).kept_uids == ["p", "q", "r", "s"]  # what counting the cut rows would keep


def test_fixed_controller_never_moves() -> None:
    ctrl = FixedKLController(0.02)
    ctrl.update(current_kl=5.0, n_steps=64)
    assert ctrl.value == 0.02


def test_adaptive_controller_follows_ziegler_update() -> None:
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=100)
    ctrl.update(current_kl=1.1, n_steps=10)  # error 0.1 -> x(1 + 0.1 * 10/100)
    assert ctrl.value == pytest.approx(0.1 * 1.01)
    ctrl.update(current_kl=10.0, n_steps=10)  # error clipped to +0.2
    assert ctrl.value == pytest.approx(0.1 * 1.01 * 1.02)
    ctrl.update(current_kl=0.0, n_steps=50)  # error clipped to -0.2
    assert ctrl.value == pytest.approx(0.1 * 1.01 * 1.02 * 0.9)
    restored = AdaptiveKLController(init_kl_coef=0.5, target_kl=1.0, horizon=100)
    restored.load_state_dict(ctrl.state_dict())
    assert restored.value == ctrl.value


@pytest.mark.parametrize(
    "cfg",
    [{"type": "adaptive", "kl_coef": 0.2, "target_kl": 0.5, "horizon": 50},
     SimpleNamespace(type="adaptive", kl_coef=0.2, target_kl=0.5, horizon=50)],
)
def test_get_kl_controller_from_config(cfg: object) -> None:
    ctrl = get_kl_controller(cfg)
    assert isinstance(ctrl, AdaptiveKLController)
    assert (ctrl.value, ctrl.target, ctrl.horizon) == (0.2, 0.5, 50)
    fixed = get_kl_controller({"type": "fixed", "kl_coef": 0.3})
    assert type(fixed) is FixedKLController and fixed.value == 0.3


def test_get_kl_controller_errors_are_actionable() -> None:
    with pytest.raises(ValueError, match="set algorithm.kl_ctrl.type to 'fixed' or 'adaptive'"):
        get_kl_controller({"type": "pid"})
    with pytest.raises(ValueError, match="horizon > 0"):
        get_kl_controller({"type": "adaptive", "horizon": 0})
