"""verl's further advantage estimators (grpo_passk, gdpo, optimal token baselines, *_vectorized) vs loop references."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from hybridflow.algorithms import ADV_ESTIMATOR_REGISTRY, get_adv_estimator_fn

EPS = 1e-6
INDEX = np.array(["a", "b", "a", "c", "a", "b"], dtype=object)
LENGTHS = [4, 2, 5, 3, 1, 5]
SCORES = [1.0, 0.0, 0.5, 2.0, 1.0, 1.5]
BS, T = len(INDEX), 5


def _mask() -> torch.Tensor:
    return torch.tensor([[1.0 if t < n else 0.0 for t in range(T)] for n in LENGTHS])


def _rewards() -> torch.Tensor:
    r = torch.zeros(BS, T)
    for i, n in enumerate(LENGTHS):
        r[i, n - 1] = SCORES[i]
    return r


def _groups(index) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(index):
        out[g].append(i)
    return out


def _std(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _whiten(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    vals = [float(adv[i, t]) for i in range(adv.shape[0]) for t in range(adv.shape[1]) if mask[i, t]]
    m = sum(vals) / len(vals)
    var = sum((v - m) ** 2 for v in vals) / (len(vals) - 1)  # verl's masked_var is unbiased
    return (adv - m) / math.sqrt(var + 1e-8) * mask


def test_vectorized_names_give_verl_numbers() -> None:
    kw = dict(token_level_rewards=_rewards(), response_mask=_mask(), index=INDEX, epsilon=EPS)
    assert ADV_ESTIMATOR_REGISTRY["grpo_vectorized"] is ADV_ESTIMATOR_REGISTRY["grpo"]
    assert ADV_ESTIMATOR_REGISTRY["gae_vectorized"] is ADV_ESTIMATOR_REGISTRY["gae"]
    adv, _ = get_adv_estimator_fn("rloo_vectorized")(**kw)
    for rows in _groups(INDEX).values():
        for i in rows:
            others = [SCORES[j] for j in rows if j != i]
            expected = SCORES[i] - sum(others) / len(others) if others else 0.0  # a group of one: 0 (verl)
            torch.testing.assert_close(adv[i], expected * _mask()[i])


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_passk_rewards_only_the_best_response_by_its_margin(norm: bool) -> None:
    index = np.array(["a", "b", "a", "a", "a", "b"], dtype=object)
    adv, ret = get_adv_estimator_fn("grpo_passk")(
        token_level_rewards=_rewards(), response_mask=_mask(), index=index, epsilon=EPS,
        norm_adv_by_std_in_grpo=norm,
    )
    expected = torch.zeros(BS)
    for rows in _groups(index).values():
        scores = [SCORES[i] for i in rows]
        best = rows[scores.index(max(scores))]
        gap = max(scores) - sorted(scores)[-2]
        expected[best] = gap / (_std(scores) + EPS) if norm else gap
    torch.testing.assert_close(adv, expected.unsqueeze(-1) * _mask())
    torch.testing.assert_close(ret, adv)
    with pytest.raises(ValueError, match="at least 2 responses per prompt"):
        get_adv_estimator_fn("grpo_passk")(token_level_rewards=_rewards(), response_mask=_mask(), index=INDEX)


def test_gdpo_normalises_each_component_in_its_group_then_whitens_the_weighted_sum() -> None:
    fmt = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    acc = [0.0, 1.0, 1.0, 0.0, 0.5, 0.25]
    prompts = torch.zeros(BS, 3, dtype=torch.long)
    attention = torch.cat([torch.ones(BS, 3), _mask()], dim=1).long()
    batch = {"prompts": prompts, "attention_mask": attention}
    config = {"gdpo_reward_keys": ["format", "accuracy"], "gdpo_reward_weights": [1.0, 0.5], "norm_adv_by_std_in_grpo": True}
    adv, _ = get_adv_estimator_fn("gdpo")(
        token_level_rewards=_rewards(), response_mask=_mask(), index=INDEX, epsilon=EPS, config=config,
        non_tensor_batch={"format": np.array(fmt, dtype=object), "accuracy": np.array(acc, dtype=object)}, batch=batch,
    )
    total = torch.zeros(BS)
    for weight, comp in ((1.0, fmt), (0.5, acc)):
        for rows in _groups(INDEX).values():
            vals = [comp[i] for i in rows]
            for i in rows:
                total[i] += weight * ((comp[i] - sum(vals) / len(vals)) / (_std(vals) + EPS) if len(rows) > 1 else comp[i] / (1 + EPS))
    torch.testing.assert_close(adv, _whiten(total.unsqueeze(-1) * _mask(), _mask()), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="'missing' is not among the reward's extra outputs"):
        get_adv_estimator_fn("gdpo")(
            token_level_rewards=_rewards(), response_mask=_mask(), index=INDEX,
            config={"gdpo_reward_keys": ["missing"]}, non_tensor_batch={}, batch=batch,
        )


def _otb_inputs() -> dict[str, object]:
    g = torch.Generator().manual_seed(0)
    rewards = _rewards() + 0.1 * torch.rand(BS, T, generator=g) * _mask()  # dense too
    return dict(
        token_level_rewards=rewards, response_mask=_mask(), index=INDEX,
        old_log_probs=-torch.rand(BS, T, generator=g) * 2, sum_pi_squared=torch.rand(BS, T, generator=g) * 0.5,
        rollout_is_weights=torch.rand(BS, T, generator=g) + 0.5,
    )


def _otb_weights(kw: dict, i: int, cols: list[int]) -> list[float]:
    out, acc = [], 0.0
    for t in cols:
        p, s, rho = (float(kw[k][i, t]) for k in ("old_log_probs", "sum_pi_squared", "rollout_is_weights"))
        acc += (1 - 2 * math.exp(p) + s) * rho**2
        out.append(acc)
    return out


def test_optimal_token_baseline_matches_the_per_position_weighted_mean() -> None:
    kw = _otb_inputs()
    adv, ret = get_adv_estimator_fn("optimal_token_baseline")(**kw)
    r = kw["token_level_rewards"]
    g = [[sum(float(r[i, s]) for s in range(t, LENGTHS[i])) for t in range(LENGTHS[i])] for i in range(BS)]
    w = [_otb_weights(kw, i, list(range(LENGTHS[i]))) for i in range(BS)]
    expected = torch.zeros(BS, T)
    for rows in _groups(INDEX).values():
        longest = sorted(rows, key=lambda i: LENGTHS[i])
        for i in rows:
            for t in range(LENGTHS[i]):
                base = 0.0
                if len(rows) > 1:
                    on = [j for j in rows if t < LENGTHS[j]]
                    base = sum(g[j][t] * w[j][t] for j in on) / (sum(w[j][t] for j in on) + 1e-8)
                    second = LENGTHS[longest[-2]]
                    if i == longest[-1] and LENGTHS[i] > second and t >= second:
                        base = 0.0  # the zero tail: nobody else reaches that position
                expected[i, t] = g[i][t] - base
                assert ret[i, t].item() == pytest.approx(g[i][t], rel=1e-5)
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)


def test_tir_optimal_token_baseline_aligns_generated_tokens_not_columns() -> None:
    kw = _otb_inputs()
    mask = _mask()
    mask[0, 1] = 0.0  # a tool turn inside response 0: its later tokens shift left by one
    mask[2, 2] = 0.0
    kw["response_mask"] = mask
    adv, _ = get_adv_estimator_fn("tir_optimal_token_baseline")(**kw)
    r = kw["token_level_rewards"] * mask
    cols = [[t for t in range(T) if mask[i, t]] for i in range(BS)]
    g = [[sum(float(r[i, s]) for s in range(t, T)) for t in cols[i]] for i in range(BS)]
    w = [_otb_weights(kw, i, cols[i]) for i in range(BS)]
    expected = torch.zeros(BS, T)
    for rows in _groups(INDEX).values():
        by_len = sorted(rows, key=lambda i: len(cols[i]))
        for i in rows:
            for k, t in enumerate(cols[i]):
                base = 0.0
                if len(rows) > 1:
                    on = [j for j in rows if k < len(cols[j])]
                    base = sum(g[j][k] * w[j][k] for j in on) / (sum(w[j][k] for j in on) + 1e-8)
                    second = len(cols[by_len[-2]])
                    if i == by_len[-1] and len(cols[i]) > second and k >= second:
                        base = 0.0
                expected[i, t] = g[i][k] - base
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)


def test_optimal_token_baselines_say_what_to_turn_on() -> None:
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        with pytest.raises(ValueError, match="calculate_sum_pi_squared=true"):
            get_adv_estimator_fn(name)(token_level_rewards=_rewards(), response_mask=_mask(), index=INDEX)
