"""Reward managers: turn a batch of generated responses into token-level scores (verl's naive/dapo/batch).

A manager decodes each response (its valid tokens only), scores it with the data source's scorer or a
custom function, and writes the score on the last valid response token of a ``(batch, response_len)``
tensor; advantage estimators read it from there. ``kind="dapo"`` adds DAPO's soft overlong punishment;
``kind="batch"`` calls a user function once per batch with lists (verl's BatchRewardManager contract);
``kind="prime"`` is verl's PrimeRewardManager (from the PRIME recipe, Cui et al. 2025, arXiv 2502.01456):
every response scored in parallel processes under a per-response timeout, a failure or overrun scoring 0,
a sequence result read as its first element, and the score returned as the batch's ``acc`` (PRIME's
verified accuracy), nothing else.
Every call runs under ``score_timeout_s`` (`hybridflow.rewards.pool`): a response whose scoring overruns
or raises gets reward 0 and counts in ``reward/timeouts`` or ``reward/errors``, which ``return_dict``
returns under ``reward_metrics``; the first such response of a batch is logged, shortened.
The manager holds only picklable state (a tokenizer, a module-level or `CustomRewardFunction` scorer),
so it can be sent to a Ray actor.
"""

from __future__ import annotations

import functools
import logging
import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Literal

import torch

from hybridflow.protocol import response_lengths_of
from hybridflow.rewards.budget import Call, Outcome, shorten
from hybridflow.rewards.pool import BudgetedScorer, default_pool_size
from hybridflow.rewards.registry import default_compute_score

logger = logging.getLogger(__name__)

Kind = Literal["naive", "dapo", "batch", "prime"]
KINDS: tuple[str, ...] = ("naive", "dapo", "batch", "prime")
DEFAULT_SCORE_TIMEOUT_S = 5.0  # reward_model.score_timeout_s's default


def overlong_penalty(
    response_length: int, max_response_length: int, buffer_length: int, factor: float
) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13): 0 up to ``max - buffer`` tokens, then a
    linear ramp to ``-factor`` at ``max`` tokens."""
    expected = max_response_length - buffer_length
    exceed = response_length - expected
    return min(-exceed / buffer_length * factor, 0.0)


def place_scores(scores: torch.Tensor, response_lengths: torch.Tensor, response_width: int) -> torch.Tensor:
    """Token-level rewards (b, R): each sequence's score on its response's last valid token, 0 elsewhere.

    An empty response gets no score. Rule scores and reward-model scores are placed the same way, so
    KL-in-reward and every advantage estimator read them alike.
    """
    out = torch.zeros(len(scores), response_width, dtype=torch.float32)
    rows = torch.nonzero(response_lengths > 0).flatten()
    out[rows, response_lengths[rows] - 1] = scores[rows].float()
    return out


class RewardManager:
    """Score decoded responses and place each score on the last valid token of its response."""

    def __init__(
        self,
        tokenizer: Any = None,
        *,
        compute_score: Callable[..., float | dict[str, Any]] | None = None,
        reward_fn_key: str = "data_source",
        num_examine: int = 0,
        kind: Kind = "naive",
        max_response_length: int | None = None,
        overlong_buffer_enable: bool = False,
        overlong_buffer_len: int = 0,
        overlong_penalty_factor: float = 1.0,
        reward_model_scores: bool = False,
        score_timeout_s: float | None = DEFAULT_SCORE_TIMEOUT_S,
        score_workers: int | None = None,
    ) -> None:
        """Configure the manager; ``compute_score`` defaults to the built-in scorers by data source.

        ``reward_model_scores``: a reward model scores every batch (``reward_model.enable``), so the
        manager returns its ``rm_scores`` and a batch manager needs no user function.
        ``score_timeout_s``: the budget of one response's scoring (a batched call gets it times the batch
        size); None: no budget, scorers run in this process. ``score_workers``: scoring processes
        (default: up to four, as many as there are CPUs).
        """
        if kind not in KINDS:
            raise ValueError(
                f"reward_model.reward_manager={kind!r} is not known; use one of {', '.join(KINDS)}."
            )
        if overlong_buffer_enable:
            if kind != "dapo":
                raise ValueError(
                    "reward_model.overlong_buffer.enable=true needs reward_model.reward_manager=dapo "
                    f"(got {kind!r}); switch the manager or disable the overlong buffer."
                )
            if max_response_length is None or not 0 < overlong_buffer_len <= max_response_length:
                raise ValueError(
                    f"reward_model.overlong_buffer.len={overlong_buffer_len} must be between 1 and "
                    f"data.max_response_length={max_response_length}; set it in that range."
                )
        if kind == "batch" and compute_score is None and not reward_model_scores:
            raise ValueError(
                "reward_model.reward_manager=batch calls a user function once per batch with lists "
                "(data_sources, solution_strs, ground_truths, extra_infos): set custom_reward_function.path "
                "to a file with such a function, use reward_manager=naive for the built-in scorers, or "
                "score with a reward model (reward_model.enable=true)."
            )
        self.tokenizer = tokenizer
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key
        self.num_examine = num_examine
        self.kind = kind
        self.max_response_length = max_response_length
        self.overlong_buffer_enable = overlong_buffer_enable
        self.overlong_buffer_len = overlong_buffer_len
        self.overlong_penalty_factor = overlong_penalty_factor
        self.score_timeout_s = score_timeout_s
        self._budgeted = BudgetedScorer(self.compute_score, workers=score_workers)

    @classmethod
    def from_config(
        cls,
        cfg: Any,
        tokenizer: Any = None,
        compute_score: Callable[..., Any] | None = None,
        num_examine: int = 0,
    ) -> RewardManager:
        """Build from a trainer config (``reward_model.reward_manager``, ``reward_model.overlong_buffer``,
        ``data.reward_fn_key``, ``data.max_response_length``), read by attribute."""
        reward_model = getattr(cfg, "reward_model", None)
        buffer = getattr(reward_model, "overlong_buffer", None)
        sandbox = getattr(reward_model, "sandbox_fusion", None)
        workers = None
        kind: Any = getattr(reward_model, "reward_manager", None) or "naive"
        if compute_score is None and sandbox is not None and kind != "batch":
            # the built-in code scorers run test cases in reward_model.sandbox_fusion (verl passes the same keywords)
            compute_score = functools.partial(
                default_compute_score, sandbox_fusion_url=sandbox.url, memory_limit_mb=sandbox.memory_limit_mb
            )
            workers = min(default_pool_size(), sandbox.max_concurrent)
        return cls(
            tokenizer,
            compute_score=compute_score,
            score_workers=workers,
            reward_fn_key=getattr(cfg.data, "reward_fn_key", None) or "data_source",
            num_examine=num_examine,
            kind=kind,
            max_response_length=getattr(cfg.data, "max_response_length", None),
            overlong_buffer_enable=bool(getattr(buffer, "enable", False)),
            overlong_buffer_len=int(getattr(buffer, "len", 0) or 0),
            overlong_penalty_factor=float(getattr(buffer, "penalty_factor", 1.0)),
            reward_model_scores=bool(getattr(reward_model, "enable", False)),
            score_timeout_s=getattr(reward_model, "score_timeout_s", DEFAULT_SCORE_TIMEOUT_S),
        )

    def __call__(self, data: Any, tokenizer: Any = None, return_dict: bool = False) -> Any:
        """Token-level scores ``(bs, response_len)``; with ``return_dict`` also per-sample extra info and
        the failure counts: ``{"reward_tensor": tensor, "reward_extra_info": {key: list of length bs},
        "reward_metrics": {"reward/timeouts": n, "reward/errors": n}}``."""
        batch = data.batch
        if "rm_scores" in batch.keys():
            # A reward model already scored the batch.
            scores = batch["rm_scores"]
            if return_dict:
                return {"reward_tensor": scores, "reward_extra_info": {}, "reward_metrics": {}}
            return scores
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        if tokenizer is None:
            raise ValueError(
                "RewardManager needs a tokenizer to decode responses: pass it to __init__ or the call."
            )
        responses = batch["responses"]
        # the whole response (a multi-turn one with its tool turns): the score lands on its last token
        valid_lengths = response_lengths_of(data)
        texts = tokenizer.batch_decode(
            [responses[i, : int(n)].tolist() for i, n in enumerate(valid_lengths)], skip_special_tokens=True
        )
        outcomes = [self._checked(o) for o in self._raw_scores(data, texts)]
        results = [self._shape(outcomes[i], int(valid_lengths[i]), data, i) for i in range(len(texts))]
        reward_tensor = place_scores(
            torch.tensor([float(reward) for reward, _ in results]), valid_lengths.long(), responses.shape[-1]
        )
        extra: dict[str, list[Any]] = defaultdict(lambda: [None] * len(results))
        for i, (_, info) in enumerate(results):
            for key, value in info.items():
                extra[key][i] = value
        self._log_examples(data, texts, results)
        self._log_failures(data, texts, outcomes)
        if return_dict:
            return {
                "reward_tensor": reward_tensor,
                "reward_extra_info": dict(extra),
                "reward_metrics": failure_metrics(outcomes),
            }
        return reward_tensor

    def _raw_scores(self, data: Any, texts: list[str]) -> list[Outcome]:
        """What the scoring function gives for each response (one call per sample, or one per batch),
        each call under its time budget."""
        non_tensor = data.non_tensor_batch
        n = len(texts)
        sources = [non_tensor[self.reward_fn_key][i] for i in range(n)]
        truths = [non_tensor["reward_model"][i]["ground_truth"] for i in range(n)]
        extras = [non_tensor["extra_info"][i] for i in range(n)] if "extra_info" in non_tensor else [None] * n
        budget = self.score_timeout_s
        if self.kind == "batch":
            # verl's BatchRewardManager contract: one call with lists, one result per sample back.
            kwargs = {
                "data_sources": sources,
                "solution_strs": texts,
                "ground_truths": truths,
                "extra_infos": extras,
            }
            call = Call(kwargs, budget * n if budget is not None else None, batched=True)
            (outcome,) = self._budgeted.run([call])
            if outcome.status != "ok":
                return [outcome] * n
            results = list(outcome.value)
            if len(results) != n:
                raise ValueError(
                    f"the batched reward function returned {len(results)} scores for {n} responses; "
                    "return one score (float or dict with 'score') per response, in order."
                )
            return [Outcome("ok", value) for value in results]
        calls = [
            Call(
                {
                    "data_source": sources[i],
                    "solution_str": texts[i],
                    "ground_truth": truths[i],
                    "extra_info": extras[i],
                },
                budget,
            )
            for i in range(n)
        ]
        return self._budgeted.run(calls)

    def _checked(self, outcome: Outcome) -> Outcome:
        """An ok outcome whose score is not a finite number (None, "abc", NaN) becomes an error."""
        if outcome.status != "ok":
            return outcome
        value = outcome.value
        if self.kind == "prime" and isinstance(value, tuple | list) and value:
            value = value[0]  # verl's PRIME manager reads (score, ...) results by their first element
            outcome = Outcome("ok", value)
        score = value.get("score", 0.0) if isinstance(value, dict) else value
        try:
            finite = math.isfinite(float(score))
        except (TypeError, ValueError, OverflowError) as exc:
            return Outcome("error", message=f"the score {shorten(repr(score), 80)} is not a number: {exc}")
        if not finite:
            return Outcome("error", message=f"the score {score!r} is not finite")
        return outcome

    def _shape(self, outcome: Outcome, length: int, data: Any, i: int) -> tuple[float, dict[str, Any]]:
        """The reward of sample ``i`` and its extra info (the scorer's dict keys, overlong shaping);
        0 with no shaping when its scoring overran or failed."""
        if outcome.status != "ok":
            return 0.0, {"acc": 0.0} if self.kind == "prime" else {"score": 0.0}
        result = outcome.value
        if isinstance(result, dict):
            if "score" not in result:
                source = data.non_tensor_batch[self.reward_fn_key][i]
                raise ValueError(
                    f"the reward function for data_source {source!r} returned a dict without a 'score' "
                    f"key (keys: {sorted(result)}); return a float or a dict with 'score'."
                )
            info = dict(result)
            reward = float(result["score"])
        else:
            reward = float(result)
            info = {"score": reward}
        if self.kind == "prime":  # PRIME keeps the verified score only, as the batch's accuracy
            return reward, {"acc": reward}
        if self.overlong_buffer_enable and self.max_response_length is not None:
            penalty = overlong_penalty(
                length, self.max_response_length, self.overlong_buffer_len, self.overlong_penalty_factor
            )
            reward += penalty
            info["overlong_reward"] = penalty
            info["overlong"] = penalty < 0
        return reward, info

    def _log_failures(self, data: Any, texts: list[str], outcomes: list[Outcome]) -> None:
        """One warning per batch with a failed scoring: the counts and the first such response, shortened."""
        failed = [i for i, outcome in enumerate(outcomes) if outcome.status != "ok"]
        if not failed:
            return
        first = failed[0]
        counts = failure_metrics(outcomes)
        logger.warning(
            "reward: %d of %d responses timed out and %d raised; they score 0. First: data_source=%s %s: %s; "
            "response=%r",
            counts["reward/timeouts"],
            len(outcomes),
            counts["reward/errors"],
            data.non_tensor_batch[self.reward_fn_key][first],
            outcomes[first].status,
            outcomes[first].message,
            shorten(texts[first], 200),
        )

    def close(self) -> None:
        """Stop the scoring processes now (they also stop when the manager is garbage-collected)."""
        self._budgeted.close()

    def _log_examples(self, data: Any, texts: list[str], results: list[tuple[float, dict[str, Any]]]) -> None:
        """Log the first ``num_examine`` responses of each data source (to eyeball what is rewarded)."""
        if self.num_examine <= 0:
            return
        shown: dict[str, int] = defaultdict(int)
        sources = data.non_tensor_batch[self.reward_fn_key]
        for i, text in enumerate(texts):
            source = str(sources[i])
            if shown[source] >= self.num_examine:
                continue
            shown[source] += 1
            truth = data.non_tensor_batch["reward_model"][i]["ground_truth"]
            logger.info("[%s] response=%r ground_truth=%r reward=%.3f", source, text, truth, results[i][0])


def failure_metrics(outcomes: list[Outcome]) -> dict[str, float]:
    """``reward/timeouts`` and ``reward/errors``: how many responses scored 0 because their scoring
    overran its budget or raised (or returned no number)."""
    return {
        "reward/timeouts": float(sum(o.status == "timeout" for o in outcomes)),
        "reward/errors": float(sum(o.status == "error" for o in outcomes)),
    }
