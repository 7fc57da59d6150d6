"""KL estimators, aggregation modes, value/entropy losses and masked helpers vs loop references."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.algorithms import (
    KL_PENALTIES,
    LOSS_AGG_MODES,
    FixedKLController,
    agg_loss,
    apply_kl_penalty,
    compute_entropy_loss,
    compute_rewards,
    compute_value_loss,
    entropy_from_logits,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    masked_var,
    masked_whiten,
)

BS, T = 4, 5
LENGTHS = [5, 2, 0, 3]


def _mask() -> torch.Tensor:
    return torch.tensor([[1.0 if t < n else 0.0 for t in range(T)] for n in LENGTHS])


def _rand(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def ref_kl(lp: float, ref: float, name: str) -> float:
    """Schulman's estimators written out per element (k3 with verl's clamps)."""
    d = lp - ref
    if name in ("kl", "k1"):
        return d
    if name == "abs":
        return abs(d)
    if name in ("mse", "k2"):
        return 0.5 * d * d
    log_r = min(max(-d, -20.0), 20.0)
    return min(max(math.exp(log_r) - log_r - 1, -10.0), 10.0)


@pytest.mark.parametrize("name", [n for n in KL_PENALTIES if not n.endswith("+")])
def test_kl_estimators_match_formulas(name: str) -> None:
    lp, ref = _rand(0, BS, T) - 1, _rand(1, BS, T) - 1
    lp[0, 0], ref[0, 0] = -30.0, 0.0  # k3 clamps: log-ratio 30 -> 20, value -> 10
    out = kl_penalty(lp, ref, name)
    expected = torch.tensor([[ref_kl(float(lp[i, t]), float(ref[i, t]), name) for t in range(T)] for i in range(BS)])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    if name in ("low_var_kl", "k3"):
        assert out[0, 0].item() == 10.0


@pytest.mark.parametrize("name", [n for n in KL_PENALTIES if n.endswith("+")])
def test_straight_through_variant_has_base_value_and_k2_gradient(name: str) -> None:
    lp = (_rand(2, BS, T) * 0.5 - 1).requires_grad_(True)
    ref = _rand(3, BS, T) * 0.5 - 1
    st = kl_penalty(lp, ref, name)
    torch.testing.assert_close(st.detach(), kl_penalty(lp, ref, name[:-1]).detach())
    (grad,) = torch.autograd.grad(st.sum(), lp)
    torch.testing.assert_close(grad, (lp - ref).detach())  # d/dlp of 0.5 (lp - ref)^2


def test_unknown_kl_name_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="Unknown KL penalty 'k4'.*low_var_kl"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")
    (grad,) = torch.autograd.grad(kl_penalty(lp := torch.zeros(2, requires_grad=True), torch.ones(2), "k3").sum(), lp)
    assert not torch.allclose(grad, lp.detach() - 1)  # plain k3 does not have k2's gradient
    with pytest.raises(ValueError, match="Unknown KL penalty 'full'"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "full")


def ref_agg(mat: torch.Tensor, mask: torch.Tensor, mode: str, scale: float | None = None) -> float:
    rows = [[float(mat[i, t]) for t in range(T) if mask[i, t]] for i in range(BS)]
    rows = [r for r in rows if r]
    if mode == "token-mean":
        flat = [x for r in rows for x in r]
        return sum(flat) / len(flat)
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in rows) / len(rows)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    return sum(sum(r) / (scale or T) for r in rows) / len(rows)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_modes_match_reference(mode: str) -> None:
    mat, mask = _rand(4, BS, T), _mask()
    mat[2, :] = float("nan")  # garbage in a fully masked row must not leak
    assert agg_loss(mat, mask, mode).item() == pytest.approx(ref_agg(mat, mask, mode), rel=1e-6)


def test_token_sum_norm_uses_a_constant_normaliser() -> None:
    mat, mask = _rand(5, BS, T), _mask()
    got = agg_loss(mat, mask, "seq-mean-token-sum-norm", loss_scale_factor=4096)
    assert got.item() == pytest.approx(ref_agg(mat, mask, "seq-mean-token-sum-norm", 4096), rel=1e-6)


def test_agg_loss_global_normalisers_make_micro_batches_add_up() -> None:
    """Two micro-batches with global counts and dp_size=1 sum to the full-batch loss."""
    mat, mask = _rand(6, BS, T), _mask()
    for mode in LOSS_AGG_MODES:
        full = agg_loss(mat, mask, mode)
        kwargs = {"batch_num_tokens": mask.sum(), "global_batch_size": (mask.sum(-1) > 0).sum()}
        parts = sum(agg_loss(mat[s], mask[s], mode, **kwargs) for s in (slice(0, 2), slice(2, 4)))
        assert parts.item() == pytest.approx(full.item(), rel=1e-6), mode
    with pytest.raises(ValueError, match="batch_num_tokens"):
        agg_loss(mat, mask, "token-mean", dp_size=2)


def test_agg_loss_empty_mask_is_zero_and_unknown_mode_is_explained() -> None:
    for mode in LOSS_AGG_MODES:
        assert agg_loss(torch.ones(2, 3), torch.zeros(2, 3), mode).item() == 0.0
    with pytest.raises(ValueError, match="Unknown loss_agg_mode 'mean'. Valid modes: token-mean"):
        agg_loss(torch.ones(2, 3), torch.ones(2, 3), "mean")


def test_bf16_aggregation_close_to_fp32() -> None:
    mat, mask = _rand(7, BS, T), _mask()
    for mode in LOSS_AGG_MODES:
        lo = agg_loss(mat.bfloat16(), mask.bfloat16(), mode).float().item()
        assert lo == pytest.approx(agg_loss(mat, mask, mode).item(), abs=0.02, rel=0.02)


def test_value_loss_matches_reference() -> None:
    vpreds, returns, values, mask = _rand(8, BS, T), _rand(9, BS, T), _rand(10, BS, T), _mask()
    eps = 0.3
    vf_loss, clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=eps)
    terms, clipped = [], 0
    for i in range(BS):
        for t in range(T):
            if mask[i, t]:
                v, r, old = float(vpreds[i, t]), float(returns[i, t]), float(values[i, t])
                vc = min(max(v, old - eps), old + eps)
                terms.append(max((v - r) ** 2, (vc - r) ** 2))
                clipped += int((vc - r) ** 2 > (v - r) ** 2)
    assert vf_loss.item() == pytest.approx(0.5 * sum(terms) / len(terms), rel=1e-5)
    assert clipfrac.item() == pytest.approx(clipped / len(terms), rel=1e-5)
    assert 0 < clipped < len(terms)


def test_entropy_and_logprobs_match_reference() -> None:
    logits = _rand(11, BS, T, 7) * 3
    labels = torch.randint(0, 7, (BS, T), generator=torch.Generator().manual_seed(12))
    ent, lp = torch.zeros(BS, T), torch.zeros(BS, T)
    for i in range(BS):
        for t in range(T):
            z = [float(x) for x in logits[i, t]]
            log_norm = math.log(sum(math.exp(x) for x in z))
            p = [math.exp(x - log_norm) for x in z]
            ent[i, t] = -sum(pi * math.log(pi) for pi in p)
            lp[i, t] = z[int(labels[i, t])] - log_norm
    torch.testing.assert_close(entropy_from_logits(logits), ent, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logprobs_from_logits(logits, labels), lp, atol=1e-5, rtol=1e-5)
    low = logprobs_from_logits(logits.bfloat16(), labels, chunk_rows=3)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), lp, atol=0.1, rtol=0.02)
    mask = _mask()
    expected = sum(float(ent[i, t]) for i in range(BS) for t in range(T) if mask[i, t]) / mask.sum().item()
    assert compute_entropy_loss(logits, mask).item() == pytest.approx(expected, rel=1e-5)


def test_masked_statistics() -> None:
    x, mask = _rand(13, BS, T), _mask()
    vals = [float(x[i, t]) for i in range(BS) for t in range(T) if mask[i, t]]
    m = sum(vals) / len(vals)
    var = sum((v - m) ** 2 for v in vals) / (len(vals) - 1)
    assert masked_mean(x, mask).item() == pytest.approx(m, rel=1e-5)
    assert masked_var(x, mask).item() == pytest.approx(var, rel=1e-5)
    w = masked_whiten(x, mask)
    assert masked_mean(w, mask).item() == pytest.approx(0.0, abs=1e-5)
    assert masked_var(w, mask).item() == pytest.approx(1.0, rel=1e-4)
    row_means = masked_mean(x, mask, axis=-1)
    assert row_means[2].item() == 0.0 and torch.isfinite(row_means).all()
    single = torch.zeros(BS, T)
    single[0, 0] = 1
    assert torch.isfinite(masked_whiten(x, single)).all()  # one valid token: variance 0, no NaN


def test_kl_in_reward() -> None:
    scores, old, ref, mask = _rand(14, BS, T) * _mask(), _rand(15, BS, T), _rand(16, BS, T), _mask()
    torch.testing.assert_close(compute_rewards(scores, old, ref, 0.1), scores - 0.1 * (old - ref))
    ctrl = FixedKLController(0.05)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, ctrl, kl_penalty="k3")
    kld = kl_penalty(old, ref, "k3") * mask
    torch.testing.assert_close(rewards, scores - 0.05 * kld)
    per_seq = [sum(float(kld[i, t]) for t in range(T)) / max(LENGTHS[i], 1e-8) if LENGTHS[i] else 0.0
               for i in range(BS)]
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(sum(per_seq) / BS, rel=1e-5)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.05

