"""Policy losses vs per-token loop references: values, metrics, gradients, config forms, errors."""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace
from typing import Any

import pydantic
import pytest
import torch

from hybridflow.algorithms import (
    LOSS_AGG_MODES,
    POLICY_LOSS_REGISTRY,
    get_policy_loss_fn,
    register_policy_loss,
)

BS, T = 5, 7
# Enough config for every registered loss (dro needs a beta, bypass_mode its rollout-correction settings).
CFG = {"clip_ratio": 0.2, "policy_loss": {"dro_beta": 0.1, "rollout_correction": {"rollout_is": None}}}
LENGTHS = [7, 4, 1, 0, 5]  # row 3 fully masked


def _inputs(seed: int = 0, spread: float = 0.4) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(T)] for n in LENGTHS])
    old = -torch.rand(BS, T, generator=g) * 2 - 0.1
    new = old + torch.randn(BS, T, generator=g) * spread  # ratios well outside [0.8, 1.2] too
    adv = torch.randn(BS, T, generator=g)
    rollout = old + torch.randn(BS, T, generator=g) * 0.5
    return old, new, adv, mask, rollout


def ref_agg(token_loss: list[list[Any]], mask: torch.Tensor, mode: str) -> Any:
    """Loop reference of the four aggregation modes (empty sequences excluded from sequence means)."""
    valid = [[t for t in range(T) if mask[i, t]] for i in range(BS)]
    seqs = [i for i in range(BS) if valid[i]]
    if mode == "token-mean":
        terms = [token_loss[i][t] for i in range(BS) for t in valid[i]]
        return sum(terms) / len(terms)
    per_seq = []
    for i in seqs:
        s = sum(token_loss[i][t] for t in valid[i])
        if mode == "seq-mean-token-mean":
            s = s / len(valid[i])
        elif mode == "seq-mean-token-sum-norm":
            s = s / T
        per_seq.append(s)
    return sum(per_seq) / len(per_seq)


def ref_vanilla(old, new, adv, mask, mode, lo=0.2, hi=0.2, c=3.0, weights=None):
    """Per-token PPO dual-clip loss built from scalar torch ops so autograd gives the reference gradient."""
    losses: list[list[Any]] = [[None] * T for _ in range(BS)]
    clipped = lower = count = 0
    kl = 0.0
    for i in range(BS):
        for t in range(T):
            log_r = torch.clamp(new[i, t] - old[i, t], -20.0, 20.0)
            r = torch.exp(log_r)
            a = adv[i, t]
            l1, l2 = -a * r, -a * torch.clamp(r, 1 - lo, 1 + hi)
            loss = l1 if l1 >= l2 else l2
            if mask[i, t]:
                count += 1
                kl += -float(log_r.detach())
                clipped += int(float(l2.detach()) > float(l1.detach()))
            if float(a) < 0 and float(loss.detach()) > float(-a * c):
                loss = -a * c
                lower += int(bool(mask[i, t]))
            if weights is not None:
                loss = loss * float(weights[i, t])
            losses[i][t] = loss
    metrics = {"actor/pg_clipfrac": clipped / count, "actor/ppo_kl": kl / count, "actor/pg_clipfrac_lower": lower / count}
    return ref_agg(losses, mask, mode), metrics


def ref_gpg(old, new, adv, mask, mode):
    return ref_agg([[-adv[i, t] * new[i, t] for t in range(T)] for i in range(BS)], mask, mode)


def ref_cispo(old, new, adv, mask, mode, lo=0.2, hi=0.2):
    losses = []
    for i in range(BS):
        row = []
        for t in range(T):
            r = math.exp(float(new[i, t].detach()) - float(old[i, t]))
            row.append(-min(max(r, 1 - lo), 1 + hi) * adv[i, t] * new[i, t])
        losses.append(row)
    return ref_agg(losses, mask, mode)


def _grad(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, x)
    return g


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize(("lo", "hi"), [(0.2, 0.2), (0.2, 0.28)])  # symmetric and DAPO clip-higher
def test_vanilla_matches_reference_value_metrics_and_grad(mode: str, lo: float, hi: float) -> None:
    old, new, adv, mask, _ = _inputs()
    new = new.requires_grad_(True)
    cfg = {"clip_ratio": 0.2, "clip_ratio_low": lo, "clip_ratio_high": hi, "clip_ratio_c": 3.0}
    loss, metrics = get_policy_loss_fn("vanilla")(old, new, adv, mask, loss_agg_mode=mode, config=cfg)
    expected, exp_metrics = ref_vanilla(old, new, adv, mask, mode, lo, hi)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    for key, value in exp_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    torch.testing.assert_close(_grad(loss, new), _grad(expected, new))


def test_vanilla_dual_clip_caps_negative_advantage_loss() -> None:
    old = torch.zeros(1, 2)
    new = torch.tensor([[3.0, 0.5]], requires_grad=True)  # ratio e^3 ~ 20 > c = 3, and e^0.5
    adv = torch.tensor([[-1.0, -1.0]])
    mask = torch.ones(1, 2)
    loss, metrics = get_policy_loss_fn("vanilla")(old, new, adv, mask, config={"clip_ratio": 0.2})
    assert loss.item() == pytest.approx((3.0 + math.exp(0.5)) / 2, rel=1e-6)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(0.5)
    # The capped token has no gradient; the other one has d(-A r)/d log pi = r / 2.
    torch.testing.assert_close(_grad(loss, new), torch.tensor([[0.0, math.exp(0.5) / 2]]))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_gpg_and_cispo_match_reference(mode: str) -> None:
    old, new, adv, mask, _ = _inputs(1)
    new = new.requires_grad_(True)
    loss, metrics = get_policy_loss_fn("gpg")(old, new, adv, mask, loss_agg_mode=mode)
    expected = ref_gpg(old, new, adv, mask, mode)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(_grad(loss, new), _grad(expected, new))
    assert metrics["actor/pg_clipfrac"] == 0.0 and metrics["actor/pg_clipfrac_lower"] == 0.0

    cfg = SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=0.28)
    loss, metrics = get_policy_loss_fn("cispo")(old, new, adv, mask, loss_agg_mode=mode, config=cfg)
    expected = ref_cispo(old, new, adv, mask, mode, 0.2, 0.28)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(_grad(loss, new), _grad(expected, new))
    assert 0 < metrics["actor/pg_clipfrac"] < 1


def test_gspo_matches_sequence_level_reference_and_gradient() -> None:
    old, new, adv, mask, _ = _inputs(2, spread=0.1)
    # GSPO uses sequence-level advantages: one value per response.
    adv = adv[:, :1].expand(BS, T).contiguous()
    new = new.requires_grad_(True)
    lo, hi = 0.03, 0.04
    loss, metrics = get_policy_loss_fn("gspo")(
        old, new, adv, mask, loss_agg_mode="seq-mean-token-mean", config={"clip_ratio_low": lo, "clip_ratio_high": hi}
    )
    seqs = [i for i in range(BS) if LENGTHS[i]]
    value, grad = 0.0, torch.zeros(BS, T)
    clipped_tokens = tokens = 0
    for i in seqs:
        n = LENGTHS[i]
        s = math.exp(sum(float(new[i, t].detach()) - float(old[i, t]) for t in range(n)) / n)  # (pi/pi_old)^(1/|y|)
        a = float(adv[i, 0])
        unclipped, clipped = -a * s, -a * min(max(s, 1 - lo), 1 + hi)
        value += max(unclipped, clipped) / len(seqs)
        tokens += n
        clipped_tokens += n * int(clipped > unclipped)
        if unclipped >= clipped:  # gradient flows only through the unclipped branch: -A * s per token
            for t in range(n):
                grad[i, t] = -a * s / n / len(seqs)
    assert loss.item() == pytest.approx(value, rel=1e-5, abs=1e-7)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(clipped_tokens / tokens)
    assert 0 < clipped_tokens < tokens  # both branches exercised
    torch.testing.assert_close(_grad(loss, new), grad, atol=1e-6, rtol=1e-5)


def test_gspo_warns_when_asked_for_another_aggregation() -> None:
    old, new, adv, mask, _ = _inputs()
    with pytest.warns(UserWarning, match="gspo ignores loss_agg_mode='token-mean'"):
        get_policy_loss_fn("gspo")(old, new, adv, mask, loss_agg_mode="token-mean", config={"clip_ratio": 0.2})


def test_truncated_importance_sampling_with_rollout_log_probs() -> None:
    old, new, adv, mask, rollout = _inputs(3)
    new = new.requires_grad_(True)
    cap = 1.5
    weights = torch.clamp(torch.exp(old - rollout), max=cap)
    assert (weights == cap).any() and (weights < 1).any()
    cfg = {"clip_ratio": 0.2, "tis_imp_ratio_cap": cap}
    loss, _ = get_policy_loss_fn("vanilla")(old, new, adv, mask, "token-mean", cfg, rollout)
    expected, _ = ref_vanilla(old, new, adv, mask, "token-mean", weights=weights)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    torch.testing.assert_close(_grad(loss, new), _grad(expected, new))
    # Without a positive cap the rollout log-probs are ignored (TIS off, verl's default -1).
    off, _ = get_policy_loss_fn("vanilla")(old, new, adv, mask, "token-mean", {"clip_ratio": 0.2}, rollout)
    plain, _ = get_policy_loss_fn("vanilla")(old, new, adv, mask, "token-mean", {"clip_ratio": 0.2})
    assert off.item() == plain.item() != loss.item()


def test_precomputed_rollout_is_weights_are_applied() -> None:
    old, new, adv, mask, _ = _inputs(4)
    weights = torch.rand(BS, T, generator=torch.Generator().manual_seed(9)) + 0.5
    for name in sorted(set(POLICY_LOSS_REGISTRY) - {"bypass_mode"}):  # bypass_mode computes its own (as verl)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mode = "seq-mean-token-mean"
            base, _ = get_policy_loss_fn(name)(old, new, adv, mask, mode, CFG)
            weighted, _ = get_policy_loss_fn(name)(old, new, adv, mask, mode, CFG, rollout_is_weights=weights)
        assert weighted.item() != pytest.approx(base.item()), name


class _ActorCfg(pydantic.BaseModel):
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = 0.28
    clip_ratio_c: float = 3.0


@pytest.mark.parametrize(
    "cfg",
    [
        {"clip_ratio": 0.2, "clip_ratio_high": 0.28},
        SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=0.28, clip_ratio_c=3.0),
        _ActorCfg(),
    ],
    ids=["dict", "namespace", "pydantic"],
)
def test_config_forms_are_equivalent(cfg: Any) -> None:
    old, new, adv, mask, _ = _inputs()
    loss, metrics = get_policy_loss_fn("vanilla")(old, new, adv, mask, config=cfg)
    expected, exp_metrics = ref_vanilla(old, new, adv, mask, "token-mean", 0.2, 0.28)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert metrics == pytest.approx(exp_metrics, rel=1e-5, abs=1e-6)


def test_bad_dual_clip_bound_is_explained() -> None:
    old, new, adv, mask, _ = _inputs()
    with pytest.raises(ValueError, match=r"clip_ratio_c=1.0: the dual-clip bound must be > 1.0"):
        get_policy_loss_fn("vanilla")(old, new, adv, mask, config={"clip_ratio_c": 1.0})


@pytest.mark.parametrize("name", sorted(POLICY_LOSS_REGISTRY))
def test_bf16_close_to_fp32_and_no_nan_with_masked_rows(name: str) -> None:
    old, new, adv, mask, _ = _inputs(5, spread=0.1)
    mode = "seq-mean-token-mean"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        l32, m32 = get_policy_loss_fn(name)(old, new, adv, mask, mode, CFG)
        bf = [x.to(torch.bfloat16) for x in (old, new, adv, mask)]
        l16, _ = get_policy_loss_fn(name)(*bf, mode, CFG)
    assert torch.isfinite(l32) and torch.isfinite(l16)
    assert l16.float().item() == pytest.approx(l32.item(), abs=0.03, rel=0.03)
    # verl's metric sets: kl_cov reports only ppo_kl, clip_cov no pg_clipfrac_lower
    expected = {"kl_cov": {"actor/ppo_kl"}, "clip_cov": {"actor/pg_clipfrac", "actor/ppo_kl"}}
    assert set(m32) >= expected.get(name, {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"})
    assert all(isinstance(v, float) for v in m32.values())


def test_fully_masked_batch_gives_zero_loss_and_zero_grad() -> None:
    old, new, adv, _, _ = _inputs()
    new = new.requires_grad_(True)
    for name in sorted(POLICY_LOSS_REGISTRY):
        for mode in LOSS_AGG_MODES:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loss, _ = get_policy_loss_fn(name)(old, new, adv, torch.zeros(BS, T), mode, CFG)
            assert loss.item() == 0.0, (name, mode)
            assert torch.equal(_grad(loss, new), torch.zeros(BS, T)), (name, mode)


def test_unknown_loss_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="Unknown policy loss 'ppo'") as err:
        get_policy_loss_fn("ppo")
    for name in ("vanilla", "gspo", "gpg", "cispo"):
        assert name in str(err.value)
    assert "policy_loss.loss_mode" in str(err.value)


def test_ported_loss_with_narrow_signature_gets_only_its_arguments() -> None:
    """A verl-era custom loss without rollout_log_probs still works under the trainer's full call."""
    seen: dict[str, Any] = {}

    def narrow(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None):
        seen["mode"] = loss_agg_mode
        return (log_prob * 0).sum(), {"actor/pg_clipfrac": 0.0, "actor/ppo_kl": 0.0, "actor/pg_clipfrac_lower": 0.0}

    register_policy_loss("test_narrow_loss")(narrow)
    try:
        old, new, adv, mask, rollout = _inputs()
        fn = get_policy_loss_fn("test_narrow_loss")
        fn(old, new, adv, mask, loss_agg_mode="seq-mean-token-sum", config=None, rollout_log_probs=rollout)
        assert seen["mode"] == "seq-mean-token-sum"
        register_policy_loss("test_narrow_loss")(narrow)  # same function again: fine
        with pytest.raises(ValueError, match="already registered"):
            register_policy_loss("test_narrow_loss")(lambda *a, **k: None)
    finally:
        POLICY_LOSS_REGISTRY.pop("test_narrow_loss", None)
