"""Advantage estimators vs naive loop references; edge cases; the one-signature contract."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hybridflow.algorithms import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageEstimator,
    get_adv_estimator_fn,
    get_policy_loss_fn,
)

EPS = 1e-6
# Groups: "a" x3, "b" x2, "c" alone, "d" x2 with equal rewards; row 7 is fully masked.
INDEX = np.array(["a", "b", "a", "c", "d", "a", "b", "d"], dtype=object)
LENGTHS = [5, 3, 6, 2, 4, 1, 6, 0]
SCORES = [1.0, 0.0, 0.5, 2.0, 1.0, -1.0, 1.5, 1.0]
BS, T = len(INDEX), 6
# grpo_passk needs two responses per group: the same rows with "c" folded into "a".
PAIRED_INDEX = np.array(["a", "b", "a", "a", "d", "a", "b", "d"], dtype=object)


def _mask() -> torch.Tensor:
    return torch.tensor([[1.0 if t < n else 0.0 for t in range(T)] for n in LENGTHS])


def _outcome_rewards() -> torch.Tensor:
    """Score on the last valid token (verl's outcome reward layout); the empty row keeps a 0 reward."""
    r = torch.zeros(BS, T)
    for i, n in enumerate(LENGTHS):
        if n:
            r[i, n - 1] = SCORES[i]
    return r


def _dense_rewards() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(BS, T, generator=g) * _mask()


def _values() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randn(BS, T, generator=g)


# ---------------------------------------------------------------- naive references (python loops)


def _groups() -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, uid in enumerate(INDEX):
        out.setdefault(uid, []).append(i)
    return out


def _row_scores(rewards: torch.Tensor) -> list[float]:
    return [sum(float(rewards[i, t]) for t in range(T)) for i in range(BS)]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _std(xs: list[float]) -> float:
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _broadcast(per_seq: list[float]) -> torch.Tensor:
    mask = _mask()
    return torch.tensor([[per_seq[i] * float(mask[i, t]) for t in range(T)] for i in range(BS)])


def _whiten(mat: list[list[float]]) -> list[list[float]]:
    mask = _mask()
    vals = [mat[i][t] for i in range(BS) for t in range(T) if mask[i, t]]
    m = _mean(vals)
    var = sum((v - m) ** 2 for v in vals) / (len(vals) - 1)
    return [[(mat[i][t] - m) / math.sqrt(var + 1e-8) * float(mask[i, t]) for t in range(T)] for i in range(BS)]


def ref_grpo(rewards: torch.Tensor, norm: bool) -> torch.Tensor:
    s = _row_scores(rewards)
    adv = [0.0] * BS
    for members in _groups().values():
        vals = [s[i] for i in members]
        mean, std = (0.0, 1.0) if len(vals) == 1 else (_mean(vals), _std(vals))
        for i in members:
            adv[i] = (s[i] - mean) / (std + EPS) if norm else s[i] - mean
    return _broadcast(adv)


def ref_rloo(rewards: torch.Tensor) -> torch.Tensor:
    s = _row_scores(rewards)
    adv = [0.0] * BS
    for members in _groups().values():
        for i in members:
            others = [s[j] for j in members if j != i]
            adv[i] = s[i] - _mean(others) if others else s[i]
    return _broadcast(adv)


def ref_opo(rewards: torch.Tensor) -> torch.Tensor:
    s = _row_scores(rewards)
    adv = [0.0] * BS
    for members in _groups().values():
        total = sum(LENGTHS[i] for i in members)
        base = sum(LENGTHS[i] * s[i] for i in members) / total if len(members) > 1 and total else 0.0
        for i in members:
            adv[i] = s[i] - base
    return _broadcast(adv)


def ref_gpg(rewards: torch.Tensor) -> torch.Tensor:
    s = _row_scores(rewards)
    nonzero = sum(1 for x in s if x != 0)
    alpha = BS / max(nonzero, 1)
    adv = [0.0] * BS
    for members in _groups().values():
        mean = 0.0 if len(members) == 1 else _mean([s[i] for i in members])
        for i in members:
            adv[i] = alpha * (s[i] - mean)
    return _broadcast(adv)


def ref_rpp_baseline(rewards: torch.Tensor) -> torch.Tensor:
    s = _row_scores(rewards)
    centred = [0.0] * BS
    for members in _groups().values():
        mean = 0.0 if len(members) == 1 else _mean([s[i] for i in members])
        for i in members:
            centred[i] = s[i] - mean
    mask = _mask()
    return torch.tensor(_whiten([[centred[i] * float(mask[i, t]) for t in range(T)] for i in range(BS)]))


def ref_rpp(rewards: torch.Tensor, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    mask = _mask()
    returns = [[0.0] * T for _ in range(BS)]
    for i in range(BS):
        g = 0.0
        for t in reversed(range(T)):
            g = float(rewards[i, t]) + gamma * g
            returns[i][t] = g * float(mask[i, t])
            if not mask[i, t]:
                g = 0.0
    return torch.tensor(_whiten(returns)), torch.tensor(returns)


def ref_remax(rewards: torch.Tensor, baselines: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mask = _mask()
    adv, ret = torch.zeros(BS, T), torch.zeros(BS, T)
    for i in range(BS):
        for t in range(T):
            if mask[i, t]:
                ret[i, t] = sum(float(rewards[i, k]) for k in range(t, T) if mask[i, k])
                adv[i, t] = ret[i, t] - float(baselines[i])
    return adv, ret


def ref_gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample: GAE over the valid tokens only, in order (masked tokens are skipped)."""
    mask = _mask()
    adv = [[0.0] * T for _ in range(BS)]
    ret = [[0.0] * T for _ in range(BS)]
    for i in range(BS):
        valid = [t for t in range(T) if mask[i, t]]
        running = 0.0
        for k in reversed(range(len(valid))):
            t = valid[k]
            next_v = float(values[i, valid[k + 1]]) if k + 1 < len(valid) else 0.0
            delta = float(rewards[i, t]) + gamma * next_v - float(values[i, t])
            running = delta + gamma * lam * running
            adv[i][t] = running
            ret[i][t] = running + float(values[i, t])
    return torch.tensor(_whiten(adv)), torch.tensor(ret)


# ---------------------------------------------------------------- tests


def _full_kwargs(rewards: torch.Tensor, **over: object) -> dict[str, object]:
    kwargs: dict[str, object] = dict(
        token_level_rewards=rewards,
        response_mask=_mask(),
        index=INDEX,
        values=_values(),
        reward_baselines=torch.linspace(-0.5, 0.5, BS),
        gamma=1.0,
        lam=1.0,
        epsilon=EPS,
        norm_adv_by_std_in_grpo=True,
        config=None,
        old_log_probs=-torch.linspace(0.5, 3.0, BS * T).reshape(BS, T),
        ref_log_prob=torch.full((BS, T), -1.5),
        sum_pi_squared=torch.linspace(0.05, 0.9, BS * T).reshape(BS, T),
    )
    kwargs.update(over)
    return kwargs


@pytest.mark.parametrize(
    ("name", "reference"),
    [
        ("grpo", lambda r: ref_grpo(r, True)),
        ("rloo", ref_rloo),
        ("opo", ref_opo),
        ("gpg", ref_gpg),
        ("reinforce_plus_plus_baseline", ref_rpp_baseline),
    ],
)
def test_outcome_estimators_match_reference(name: str, reference) -> None:
    rewards = _outcome_rewards()
    adv, ret = get_adv_estimator_fn(name)(**_full_kwargs(rewards))
    expected = reference(rewards)
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret, expected, atol=1e-5, rtol=1e-5)


def test_dr_grpo_advantage_is_centred_not_scaled() -> None:
    rewards = _outcome_rewards()
    adv, _ = get_adv_estimator_fn("grpo")(**_full_kwargs(rewards, norm_adv_by_std_in_grpo=False))
    torch.testing.assert_close(adv, ref_grpo(rewards, False))


def test_grpo_reads_norm_flag_from_config_when_not_passed() -> None:
    rewards = _outcome_rewards()
    kwargs = _full_kwargs(rewards, norm_adv_by_std_in_grpo=None, config={"norm_adv_by_std_in_grpo": False})
    adv, _ = get_adv_estimator_fn("grpo")(**kwargs)
    torch.testing.assert_close(adv, ref_grpo(rewards, False))


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus_matches_reference(gamma: float) -> None:
    rewards = _dense_rewards()
    adv, ret = get_adv_estimator_fn("reinforce_plus_plus")(**_full_kwargs(rewards, gamma=gamma))
    exp_adv, exp_ret = ref_rpp(rewards, gamma)
    torch.testing.assert_close(adv, exp_adv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret, exp_ret, atol=1e-5, rtol=1e-5)


def test_reinforce_plus_plus_takes_gamma_from_config() -> None:
    rewards = _dense_rewards()
    adv, _ = get_adv_estimator_fn("reinforce_plus_plus")(
        **_full_kwargs(rewards, gamma=None, config=SimpleNamespace(gamma=0.5))
    )
    torch.testing.assert_close(adv, ref_rpp(rewards, 0.5)[0], atol=1e-5, rtol=1e-5)


def test_remax_matches_reference() -> None:
    rewards = _dense_rewards()
    baselines = torch.linspace(-0.5, 0.5, BS)
    adv, ret = get_adv_estimator_fn("remax")(**_full_kwargs(rewards, reward_baselines=baselines))
    exp_adv, exp_ret = ref_remax(rewards, baselines)
    torch.testing.assert_close(adv, exp_adv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret, exp_ret, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95)])
def test_gae_matches_reference(gamma: float, lam: float) -> None:
    rewards, values = _dense_rewards(), _values()
    adv, ret = get_adv_estimator_fn("gae")(**_full_kwargs(rewards, values=values, gamma=gamma, lam=lam))
    exp_adv, exp_ret = ref_gae(rewards, values, gamma, lam)
    torch.testing.assert_close(adv, exp_adv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret, exp_ret, atol=1e-5, rtol=1e-5)


def test_gae_skips_masked_tokens_inside_a_response() -> None:
    """A multi-turn response with tool output in the middle: GAE bridges over the masked tokens."""
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]])
    rewards = torch.tensor([[0.0, 0.0, 5.0, 5.0, 0.0, 1.0]]) * mask
    values = torch.tensor([[0.1, 0.2, 9.0, 9.0, 0.3, 0.4]])
    _, ret = get_adv_estimator_fn("gae")(
        token_level_rewards=rewards, response_mask=mask, values=values, gamma=1.0, lam=1.0
    )
    # gamma = lam = 1: every valid token's return is the sum of later valid rewards (= 1).
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]]))


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATOR_REGISTRY))
def test_every_estimator_takes_the_same_call_and_respects_the_mask(name: str) -> None:
    rewards = _outcome_rewards()
    kwargs = _full_kwargs(rewards, gamma=0.99, lam=0.95, config={"gamma": 0.99, "lam": 0.95})
    kwargs["unused_future_argument"] = 123  # **kwargs tolerated
    if name == "grpo_passk":
        kwargs["index"] = PAIRED_INDEX
    adv, ret = get_adv_estimator_fn(name)(**kwargs)
    mask = _mask()
    assert adv.shape == ret.shape == (BS, T)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()
    assert adv[mask == 1].abs().sum() > 0


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATOR_REGISTRY))
def test_bf16_inputs_close_to_fp32(name: str) -> None:
    rewards = _outcome_rewards() + 0.25 * _dense_rewards()
    base = _full_kwargs(rewards, gamma=0.99, lam=0.95, **({"index": PAIRED_INDEX} if name == "grpo_passk" else {}))
    low = dict(base)
    for key in ("token_level_rewards", "response_mask", "values", "reward_baselines"):
        low[key] = base[key].to(torch.bfloat16)  # type: ignore[union-attr]
    adv32, ret32 = get_adv_estimator_fn(name)(**base)
    adv16, ret16 = get_adv_estimator_fn(name)(**low)
    assert adv16.dtype == torch.bfloat16
    torch.testing.assert_close(adv16.float(), adv32, atol=0.05, rtol=0.02)
    torch.testing.assert_close(ret16.float(), ret32, atol=0.05, rtol=0.02)


def test_group_edge_cases_for_grpo() -> None:
    mask = torch.ones(5, 2)
    rewards = torch.tensor([[0.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 3.0], [0.0, 0.0]])
    index = np.array(["same", "same", "same", "alone", "other"])
    for norm in (True, False):
        adv, _ = get_adv_estimator_fn("grpo")(
            token_level_rewards=rewards, response_mask=mask, index=index, norm_adv_by_std_in_grpo=norm
        )
        assert torch.equal(adv[:3], torch.zeros(3, 2))  # all-equal group: zero advantage, no NaN
        # A group of one keeps its raw score (mean 0, std 1), as verl does.
        expected = 3.0 / (1 + EPS) if norm else 3.0
        torch.testing.assert_close(adv[3], torch.full((2,), expected))


def test_index_may_be_a_list_of_ints() -> None:
    rewards = _outcome_rewards()
    as_ints = [{"a": 0, "b": 1, "c": 2, "d": 3}[u] for u in INDEX]
    adv, _ = get_adv_estimator_fn("grpo")(**_full_kwargs(rewards, index=as_ints))
    torch.testing.assert_close(adv, ref_grpo(rewards, True))


def test_fully_masked_batch_gives_zeros_not_nan() -> None:
    mask = torch.zeros(4, 3)
    for name in sorted(ADV_ESTIMATOR_REGISTRY):
        adv, ret = get_adv_estimator_fn(name)(
            token_level_rewards=torch.zeros(4, 3), response_mask=mask, index=np.array(["x", "x", "y", "y"]),
            values=torch.zeros(4, 3), reward_baselines=torch.zeros(4), old_log_probs=torch.zeros(4, 3),
            ref_log_prob=torch.zeros(4, 3), sum_pi_squared=torch.zeros(4, 3),
        )
        assert torch.equal(adv, torch.zeros(4, 3)) and torch.equal(ret, torch.zeros(4, 3)), name


@pytest.mark.parametrize(
    ("name", "drop", "message"),
    [
        ("grpo", "index", "needs `index`"),
        ("gae", "values", "needs `values`"),
        ("remax", "reward_baselines", "needs `reward_baselines`"),
    ],
)
def test_missing_inputs_say_what_is_needed(name: str, drop: str, message: str) -> None:
    kwargs = _full_kwargs(_outcome_rewards())
    kwargs[drop] = None
    with pytest.raises(ValueError, match=message):
        get_adv_estimator_fn(name)(**kwargs)


def test_index_length_mismatch_is_reported() -> None:
    with pytest.raises(ValueError, match="index has 3 entries but the batch has 8"):
        get_adv_estimator_fn("rloo")(**_full_kwargs(_outcome_rewards(), index=INDEX[:3]))


def test_unknown_estimator_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="Unknown advantage estimator 'grpoo'") as err:
        get_adv_estimator_fn("grpoo")
    for name in AdvantageEstimator:
        assert name.value in str(err.value)
    assert get_adv_estimator_fn(AdvantageEstimator.RLOO) is get_adv_estimator_fn("rloo")


def test_dr_grpo_config_combination() -> None:
    """Dr.GRPO = grpo without std normalisation + seq-mean-token-sum-norm aggregation."""
    rewards, mask = _outcome_rewards(), _mask()
    adv, _ = get_adv_estimator_fn("grpo")(**_full_kwargs(rewards, norm_adv_by_std_in_grpo=False))
    g = torch.Generator().manual_seed(3)
    old = torch.randn(BS, T, generator=g) * 0.1 - 1.0
    new = (old + torch.randn(BS, T, generator=g) * 0.05).requires_grad_(True)
    loss, _ = get_policy_loss_fn("vanilla")(
        old, new, adv, mask, loss_agg_mode="seq-mean-token-sum-norm", config={"clip_ratio": 0.2}
    )
    # Liu et al. 2025: L = 1/G sum_i 1/L_max sum_t l_it over the non-empty sequences (G = 7 here).
    token_losses = []
    for i in range(BS):
        for t in range(T):
            if mask[i, t]:
                r = math.exp(float(new[i, t].detach()) - float(old[i, t]))
                a = float(adv[i, t])
                token_losses.append(max(-a * r, -a * min(max(r, 0.8), 1.2)))
    expected = sum(token_losses) / T / sum(1 for n in LENGTHS if n)
    assert loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-7)
