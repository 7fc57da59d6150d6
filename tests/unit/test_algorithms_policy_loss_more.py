"""verl's further policy losses (sapo, geo_mean, clip_cov, kl_cov, dppo_tv, dppo_kl, dro, bypass_mode) vs
per-token loop references written from the papers' / verl's formulas; gradients; config keys; errors."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from hybridflow._config.async_training import RolloutCorrectionConfig
from hybridflow.algorithms import get_policy_loss_fn

BS, T = 5, 7
LENGTHS = [7, 4, 1, 0, 5]  # row 3 fully masked


def _inputs(seed: int = 0, spread: float = 0.4) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(T)] for n in LENGTHS])
    old = -torch.rand(BS, T, generator=g) * 2 - 0.1
    new = old + torch.randn(BS, T, generator=g) * spread
    adv = torch.randn(BS, T, generator=g)
    return old, new, adv, mask


def _tokens(mask: torch.Tensor) -> list[tuple[int, int]]:
    return [(i, t) for i in range(BS) for t in range(T) if mask[i, t] > 0]


def _token_mean(values: dict[tuple[int, int], float]) -> float:
    return sum(values.values()) / max(len(values), 1)


def _seq_mean_token_mean(values: dict[tuple[int, int], float]) -> float:
    rows = sorted({i for i, _ in values})
    return sum(sum(v for (r, _), v in values.items() if r == i) / LENGTHS[i] for i in rows) / len(rows)


def _quiet(name: str, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_policy_loss_fn(name)(*args, **kwargs)


def test_sapo_matches_the_gate_formula_and_its_gradient_is_the_policy_gradient_at_ratio_one() -> None:
    old, new, adv, mask = _inputs()
    cfg = {"tau_pos": 1.0, "tau_neg": 1.05}
    loss, metrics = _quiet("sapo", old, new, adv, mask, "token-mean", cfg)
    ref = {}
    for i, t in _tokens(mask):
        r, a = math.exp(new[i, t] - old[i, t]), float(adv[i, t])
        tau = 1.0 if a > 0 else 1.05
        ref[(i, t)] = -a * (1 / (1 + math.exp(-tau * (r - 1)))) * 4 / tau
    assert loss.item() == pytest.approx(_seq_mean_token_mean(ref), rel=1e-5)  # per sequence, as verl
    assert metrics["actor/pg_clipfrac"] == 0.0
    # at ratio 1 the gate's slope is 4 sigmoid'(0) = 1: the same gradient as -A log pi
    lp = old.clone().requires_grad_(True)
    (g_sapo,) = torch.autograd.grad(_quiet("sapo", old, lp, adv, mask, "seq-mean-token-mean", cfg)[0], lp)
    (g_pg,) = torch.autograd.grad(_quiet("gpg", old, lp, adv, mask, "seq-mean-token-mean", cfg)[0], lp)
    torch.testing.assert_close(g_sapo, g_pg)


def test_geo_mean_is_the_clipped_geometric_mean_ratio_per_sequence() -> None:
    old, new, adv, mask = _inputs(1)
    adv = adv[:, :1].expand(BS, T).contiguous()  # one advantage per sequence, as GMPO assumes
    lo, hi = 0.4, 0.4
    loss, metrics = _quiet("geo_mean", old, new, adv, mask, "token-mean", {"clip_ratio_low": lo, "clip_ratio_high": hi})
    per_seq, clipped_hi, clipped_lo = [], 0, 0
    for i in range(BS):
        if not LENGTHS[i]:
            continue
        s, a = 0.0, float(adv[i, 0])
        for t in range(LENGTHS[i]):
            lr = float(new[i, t] - old[i, t])
            c = min(max(lr, -lo), hi)
            s += min(lr, c) if a > 0 else (max(lr, c) if a < 0 else 0.0)
            clipped_hi += int(c != lr and a > 0)
            clipped_lo += int(c != lr and a < 0)
        per_seq.append(-a * math.exp(s / LENGTHS[i]))
    assert loss.item() == pytest.approx(sum(per_seq) / len(per_seq), rel=1e-5)
    n = sum(LENGTHS)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(clipped_hi / n)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(clipped_lo / n)


def _cov(adv: torch.Tensor, new: torch.Tensor, mask: torch.Tensor) -> dict[tuple[int, int], float]:
    toks = _tokens(mask)
    ma = sum(float(adv[i, t]) for i, t in toks) / len(toks)
    ml = sum(float(new[i, t]) for i, t in toks) / len(toks)
    return {(i, t): (float(adv[i, t]) - ma) * (float(new[i, t]) - ml) for i, t in toks}


def test_clip_cov_cuts_the_covariance_band_tokens_the_ppo_clip_left_alone() -> None:
    old, new, adv, mask = _inputs(2, spread=0.3)
    adv = adv * 4  # covariances of order 1
    # a ratio big enough that every eligible token is cut: the choice is then deterministic
    cfg = {"clip_ratio": 0.2, "policy_loss": {"clip_cov_ratio": 1.0, "clip_cov_lb": 0.2, "clip_cov_ub": 5.0}}
    loss, metrics = get_policy_loss_fn("clip_cov")(old, new, adv, mask, "token-mean", cfg)
    cov, ref, cut = _cov(adv, new, mask), {}, 0
    for i, t in _tokens(mask):
        r, a = math.exp(new[i, t] - old[i, t]), float(adv[i, t])
        l1, l2 = -a * r, -a * min(max(r, 0.8), 1.2)
        eligible = 0.2 < cov[(i, t)] < 5.0 and not l2 > l1
        cut += int(eligible)
        ref[(i, t)] = 0.0 if eligible else max(l1, l2)
    assert 0 < cut < len(ref)
    assert loss.item() == pytest.approx(_token_mean(ref), rel=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(cut / len(ref))
    # the default share (2e-4 of the tokens, at least 1) cuts exactly one token
    _, few = get_policy_loss_fn("clip_cov")(old, new, adv, mask, "token-mean", {"policy_loss": {"clip_cov_lb": 0.2}})
    assert few["actor/pg_clipfrac"] == pytest.approx(1 / len(ref))


def test_kl_cov_penalises_the_top_covariance_tokens() -> None:
    old, new, adv, mask = _inputs(3)
    n = sum(LENGTHS)
    cfg = {"policy_loss": {"kl_cov_ratio": 0.25, "ppo_kl_coef": 0.5}}
    loss, metrics = get_policy_loss_fn("kl_cov")(old, new, adv, mask, "token-mean", cfg)
    cov = _cov(adv, new, mask)
    top = set(sorted(cov, key=cov.get, reverse=True)[: int(n * 0.25)])
    ref = {}
    for i, t in _tokens(mask):
        lr, a = float(new[i, t] - old[i, t]), float(adv[i, t])
        ref[(i, t)] = -a * math.exp(lr) + (0.5 * abs(lr) if (i, t) in top else 0.0)
    assert loss.item() == pytest.approx(_token_mean(ref), rel=1e-5)
    assert set(metrics) == {"actor/ppo_kl"}  # verl's one metric: the mean |log ratio|
    assert metrics["actor/ppo_kl"] == pytest.approx(_token_mean({k: abs(float(new[k] - old[k])) for k in ref}))


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo_drops_tokens_outside_the_divergence_trust_region(name: str) -> None:
    old, new, adv, mask = _inputs(4, spread=0.5)
    new = new.clamp(max=-0.05)  # real log-probs: p < 1
    lo, hi, cap = 0.05, 0.08, 1.5
    cfg = {"clip_ratio_low": lo, "clip_ratio_high": hi, "clip_ratio_c": cap}
    lp = new.clone().requires_grad_(True)
    loss, metrics = get_policy_loss_fn(name)(old, lp, adv, mask, "token-mean", cfg)
    ref, dropped, grads = {}, 0, torch.zeros(BS, T)
    n = sum(LENGTHS)
    for i, t in _tokens(mask):
        p, q, a = math.exp(new[i, t]), math.exp(old[i, t]), float(adv[i, t])
        if name == "dppo_tv":
            keep = (p - q) <= hi if a > 0 else (p - q) >= -lo
        else:
            kl = q * (math.log(q) - math.log(p)) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))
            keep = (kl <= hi or p <= q) if a > 0 else (kl <= lo or p >= q)
        w = min(p / q, cap)
        ref[(i, t)] = -a * w * float(new[i, t]) if keep else 0.0
        grads[i, t] = -a * w / n if keep else 0.0  # the weight is a constant: d/dlogpi = -A w
        dropped += int(not keep)
    assert 0 < dropped < n
    assert loss.item() == pytest.approx(_token_mean(ref), rel=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(dropped / n)
    (grad,) = torch.autograd.grad(loss, lp)
    torch.testing.assert_close(grad, grads, atol=1e-6, rtol=1e-5)


def test_dro_is_the_quadratic_proximal_objective() -> None:
    old, new, adv, mask = _inputs(5)
    beta = 0.3
    loss, _ = get_policy_loss_fn("dro")(old, new, adv, mask, "seq-mean-token-mean", {"policy_loss": {"dro_beta": beta}})
    ref = {(i, t): -(float(new[i, t]) * float(adv[i, t]) - 0.5 * beta * float(new[i, t] - old[i, t]) ** 2)
           for i, t in _tokens(mask)}
    assert loss.item() == pytest.approx(_seq_mean_token_mean(ref), rel=1e-5)
    with pytest.raises(ValueError, match="dro needs a positive dro_beta"):
        get_policy_loss_fn("dro")(old, new, adv, mask, "token-mean", {"policy_loss": {}})


def _bypass_cfg(**correction: object) -> dict[str, object]:
    return {"clip_ratio": 0.2, "policy_loss": {"rollout_correction": RolloutCorrectionConfig(**correction)}}


def test_bypass_reinforce_weights_the_policy_gradient_by_truncated_is_against_the_current_policy() -> None:
    rollout, new, adv, mask = _inputs(6, spread=0.5)
    cap = 1.5
    lp = new.clone().requires_grad_(True)
    loss, metrics = get_policy_loss_fn("bypass_mode")(
        rollout, lp, adv, mask, "token-mean", _bypass_cfg(rollout_is="token", rollout_is_threshold=cap, loss_type="reinforce")
    )
    n = sum(LENGTHS)
    ref, grads = {}, torch.zeros(BS, T)
    for i, t in _tokens(mask):
        w = min(math.exp(new[i, t] - rollout[i, t]), cap)
        ref[(i, t)] = -float(adv[i, t]) * float(new[i, t]) * w
        grads[i, t] = -float(adv[i, t]) * w / n
    assert loss.item() == pytest.approx(_token_mean(ref), rel=1e-5)
    torch.testing.assert_close(torch.autograd.grad(loss, lp)[0], grads, atol=1e-6, rtol=1e-5)
    assert metrics["rollout_corr/rollout_is_max"] <= cap
    assert metrics["actor/ppo_kl"] == pytest.approx(_token_mean({k: float(rollout[k] - new[k]) for k in ref}), rel=1e-5)


def test_bypass_ppo_clip_is_vanilla_against_the_rollout_on_the_tokens_rejection_keeps() -> None:
    rollout, new, adv, mask = _inputs(7, spread=0.5)
    cfg = _bypass_cfg(rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold="0.7_1.4")
    loss, metrics = get_policy_loss_fn("bypass_mode")(rollout, new, adv, mask, "token-mean", cfg)
    keep = torch.zeros(BS, T)
    for i, t in _tokens(mask):
        keep[i, t] = float(0.7 <= math.exp(new[i, t] - rollout[i, t]) <= 1.4)
    assert 0 < keep.sum() < mask.sum()
    # no IS weights on top of the ratio: it already is pi / pi_rollout (verl avoids double counting)
    expected, _ = get_policy_loss_fn("vanilla")(rollout, new, adv, mask * keep, "token-mean", {"clip_ratio": 0.2})
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 - float(keep.sum() / mask.sum()))


def test_bypass_mode_without_its_settings_says_where_they_come_from() -> None:
    old, new, adv, mask = _inputs()
    with pytest.raises(ValueError, match="algorithm.rollout_correction.bypass_mode=true"):
        get_policy_loss_fn("bypass_mode")(old, new, adv, mask, "token-mean", {"clip_ratio": 0.2})


def test_up_is_unclipped_reinforce_for_positive_advantages_and_dual_clip_ppo_otherwise() -> None:
    old, new, adv, mask = _inputs(8, spread=0.5)
    lp = new.clone().requires_grad_(True)
    loss, metrics = get_policy_loss_fn("up")(old, lp, adv, mask, "token-mean", {"clip_ratio": 0.2, "clip_ratio_c": 3.0})
    n = sum(LENGTHS)
    ref, grads = {}, torch.zeros(BS, T)
    for i, t in _tokens(mask):
        r, a = math.exp(new[i, t] - old[i, t]), float(adv[i, t])
        if a > 0:
            ref[(i, t)], grads[i, t] = -a, -a / n  # value 1 x -A, gradient of -A log pi
            continue
        l1, l2 = -a * r, -a * min(max(r, 0.8), 1.2)
        value = min(max(l1, l2), -a * 3.0) if a < 0 else max(l1, l2)
        ref[(i, t)] = value
        grads[i, t] = (-a * r / n) if value == l1 else 0.0  # only the unclipped branch moves with log pi
    assert loss.item() == pytest.approx(_token_mean(ref), rel=1e-5)
    torch.testing.assert_close(torch.autograd.grad(loss, lp)[0], grads, atol=1e-6, rtol=1e-5)
    assert set(metrics) >= {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"}
