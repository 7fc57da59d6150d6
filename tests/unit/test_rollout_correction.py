"""Rollout correction (verl's `algorithm.rollout_correction`): importance weights, rejection masks, metrics, and
how the trainer applies them to a batch; plus the asynchronous-training figures in progress and status."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow._config.async_training import RolloutCorrectionConfig
from hybridflow.algorithms.rollout_corr import correction_metrics, importance_weights, rejection_mask
from hybridflow.protocol import DataProto
from hybridflow.trainer.batch_ops import apply_rollout_correction

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
LOG_RATIO = torch.tensor([[math.log(3.0), 0.0, math.log(0.5), 9.0], [math.log(1.5), math.log(1.2), 5.0, 5.0]])


def test_token_weights_are_truncated_ratios_and_zero_off_the_mask() -> None:
    w = importance_weights(LOG_RATIO * MASK, MASK, "token", None, 2.0, normalize=False)
    assert torch.allclose(w, torch.tensor([[2.0, 1.0, 0.5, 0.0], [1.5, 1.2, 0.0, 0.0]]))


def test_sequence_weights_are_the_product_broadcast_and_icepop_zeroes_outside_the_band() -> None:
    w = importance_weights(LOG_RATIO * MASK, MASK, "sequence", None, 10.0, normalize=False)
    assert torch.allclose(w[0, :3], torch.full((3,), 1.5)) and torch.allclose(w[1, :2], torch.full((2,), 1.8))
    band = importance_weights(LOG_RATIO * MASK, MASK, "token", 0.8, 2.0, normalize=False)  # IcePop [0.8, 2]
    assert torch.allclose(band, torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.5, 1.2, 0.0, 0.0]]))
    normed = importance_weights(LOG_RATIO * MASK, MASK, "token", None, 2.0, normalize=True)
    assert float(normed[MASK.bool()].mean()) == pytest.approx(1.0)


def test_rejection_drops_tokens_or_whole_sequences() -> None:
    token = rejection_mask(LOG_RATIO * MASK, MASK, [("token", "k1", 0.6, 1.6)])  # ratio outside [0.6, 1.6]
    assert token.tolist() == [[0, 1, 0, 0], [1, 1, 0, 0]]
    seq = rejection_mask(LOG_RATIO * MASK, MASK, [("seq_max", "k2", None, 0.3)])  # max 0.5 (log r)^2 > 0.3
    assert seq.tolist() == [[0, 0, 0, 0], [1, 1, 0, 0]]


def test_the_trainer_weights_the_loss_masks_rejected_tokens_and_logs_verl_metrics() -> None:
    rollout = torch.log(torch.full((2, 4), 0.5))
    batch = DataProto.from_dict({"response_mask": MASK.clone(), "rollout_log_probs": rollout,
                                 "old_log_probs": rollout + LOG_RATIO * MASK})
    cfg = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k1",
                                  rollout_rs_threshold="0.6_1.6")
    metrics = apply_rollout_correction(batch, cfg)
    assert batch.batch["response_mask"].tolist() == [[0, 1, 0, 0], [1, 1, 0, 0]]
    assert torch.allclose(batch.batch["rollout_is_weights"][0, :3], torch.tensor([2.0, 1.0, 0.5]))
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0)
    assert metrics["rollout_corr/kl"] == pytest.approx(-float((LOG_RATIO * MASK).sum()) / 5)
    assert metrics["rollout_corr/k3_kl"] > 0


def test_identical_policies_show_no_gap() -> None:
    lp = torch.log(torch.full((2, 4), 0.3))
    metrics = correction_metrics(lp, lp, MASK)
    assert metrics["rollout_corr/kl"] == 0 and metrics["rollout_corr/chi2_token"] == pytest.approx(0.0, abs=1e-6)


def test_policy_version_and_staleness_reach_progress_prometheus_and_status() -> None:
    from hybridflow.progress import summarize_metrics
    from rljob_operator.trainer_progress import (
        build_progress_status,
        parse_progress_record,
        parse_trainer_metrics,
    )

    summary = summarize_metrics({"fully_async/policy_version": 12.0, "fully_async/trajectory_staleness/max": 1.0,
                                 "fully_async/trajectory_staleness/mean": 0.6, "critic/score/mean": 0.5})
    assert summary["policy_version"] == 12 and summary["staleness_max"] == 1 and summary["staleness_mean"] == 0.6
    report = parse_progress_record('{"step": 13, "metrics": {"policy_version": 12, "staleness_max": 1.0}}')
    assert build_progress_status(report)["metrics"] == {"policyVersion": 12, "stalenessMax": 1.0}
    scraped = parse_trainer_metrics("hybridflow_step 13\nhybridflow_policy_version 12\nhybridflow_staleness_max 1\n")
    assert scraped is not None and scraped.policy_version == 12 and scraped.staleness_max == 1.0
