"""Reward-model scoring for real: tiny reward models against plain HF forwards, then a GRPO run scored by one.

Single process first (the `RewardModelWorker` outside Ray, one rank): scores equal the HF model's output
at each response's last valid token, with any micro-batching, for token- and sequence-classification
checkpoints, and through the re-rendering path (`input_tokenizer`). Then `hybridflow.trainer.main_ppo`
with `reward_model.enable=true` on 2 CPU workers, the reward model on a pool of its own (2 more): the reward is
the reward model's, not the rule's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hybridflow.config import load_config
from hybridflow.data.toy import build_toy_tokenizer
from hybridflow.models.tiny import build_tiny_model
from hybridflow.protocol import DataProto
from hybridflow.workers.reward_model_worker import RewardModelWorker
from tests.support.ray_local import local_ray
from tests.support.rm_batches import rollout_batch

# The toy template without the newline after each turn: prompt rendered for generation + response + EOS
# is then exactly what the template renders for the whole chat.
TIGHT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% else %}{{ '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
CONSTANT = 0.375  # the score of the constant reward model (a toy rule score is 0 or 1)


def save_reward_model(
    policy: Path, out: Path, kind: str = "token", constant: float | None = None, template: str | None = None
) -> Path:
    """A 1-label reward model from a tiny policy folder: its trunk plus a seeded `score` head.

    kind "token" saves a token classifier (head with bias), "sequence" a sequence classifier (no bias).
    `constant`: a zero head whose bias is this value, so every response scores exactly it.
    """
    from transformers import (
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
    )

    cls = AutoModelForTokenClassification if kind == "token" else AutoModelForSequenceClassification
    model = cls.from_pretrained(policy, num_labels=1)
    torch.manual_seed(7)
    with torch.no_grad():
        model.score.weight.normal_(0.0, 0.5)
        if constant is not None:
            model.score.weight.zero_()
            model.score.bias.fill_(constant)
    model.config.pad_token_id = model.config.pad_token_id or 0
    model.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    if template is not None:
        tokenizer.chat_template = template
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("rm")
    policy = build_tiny_model(root / "policy", arch="llama")
    return {
        "policy": policy,
        "token": save_reward_model(policy, root / "rm_token"),
        "tight": save_reward_model(policy, root / "rm_tight", template=TIGHT_TEMPLATE),
        "sequence": save_reward_model(policy, root / "rm_seq", kind="sequence"),
        "constant": save_reward_model(policy, root / "rm_const", constant=CONSTANT),
    }


# uneven response lengths 2..6 tokens; the last one is cut at 6 tokens, without EOS
PAIRS = [
    ("copy a", "a"),
    ("3+4=", "7"),
    ("count a in abba", "2"),
    ("copy bcd", "bcd"),
    ("9-3=", "6"),
    ("copy e", "eeeeeeeee"),
]


def worker(rm_path: Path, policy: Path, *overrides: str) -> RewardModelWorker:
    cfg = load_config(
        None,
        [
            f"actor_rollout_ref.model.path={policy}",
            "trainer.device=cpu",
            "trainer.n_gpus_per_node=1",
            "data.max_prompt_length=24",
            "data.max_response_length=6",
            "reward_model.enable=true",
            f"reward_model.model.path={rm_path}",
            *overrides,
        ],
    )
    w = RewardModelWorker(cfg)
    w.init_model()
    return w


def hf_last_token_scores(rm_path: Path, data: DataProto) -> torch.Tensor:
    """Plain HF token classifier on each row's valid tokens alone (no padding), output at the last one."""
    from transformers import AutoModelForTokenClassification

    model = AutoModelForTokenClassification.from_pretrained(rm_path, num_labels=1).eval()
    out = []
    with torch.no_grad():
        for ids, mask in zip(data.batch["input_ids"], data.batch["attention_mask"], strict=True):
            out.append(model(input_ids=ids[mask.bool()][None]).logits[0, -1, 0])
    return torch.stack(out)


def test_scores_equal_a_plain_hf_forward_at_the_last_valid_token(models: dict[str, Path]) -> None:
    tok = build_toy_tokenizer()
    data = rollout_batch(tok, PAIRS)
    lengths = data.batch["response_mask"].sum(-1)
    assert lengths.tolist() == [2, 2, 2, 4, 2, 6]
    expected = hf_last_token_scores(models["token"], data)
    for overrides in [
        (),
        ("reward_model.micro_batch_size_per_gpu=2",),
        ("reward_model.use_dynamic_bsz=true", "reward_model.forward_max_token_len_per_gpu=40"),
    ]:
        out = worker(models["token"], models["policy"], *overrides).compute_rm_score(data)
        rm = out.batch["rm_scores"]
        assert rm.shape == data.batch["responses"].shape
        for i, n in enumerate(lengths.tolist()):
            assert torch.allclose(rm[i, n - 1], expected[i], atol=1e-5), (overrides, i)
            assert torch.count_nonzero(rm[i]) == 1 and rm[i, n - 1] != 0
        assert torch.allclose(rm.sum(-1), expected, atol=1e-5)


def test_a_sequence_classification_checkpoint_scores_like_its_hf_class(models: dict[str, Path]) -> None:
    """Its head (no bias) loads as the 1-label token head; HF's own pooling (last non-pad token) agrees."""
    from transformers import AutoModelForSequenceClassification

    data = rollout_batch(build_toy_tokenizer(), PAIRS)
    hf = AutoModelForSequenceClassification.from_pretrained(models["sequence"]).eval()
    with torch.no_grad():
        expected = hf(
            input_ids=data.batch["input_ids"],
            attention_mask=data.batch["attention_mask"],
            position_ids=data.batch["position_ids"],
        ).logits[:, 0]
    rm = worker(models["sequence"], models["policy"]).compute_rm_score(data).batch["rm_scores"]
    assert torch.allclose(rm.sum(-1), expected, atol=1e-5)


def test_re_rendered_inputs_with_the_same_tokenizer_score_like_the_direct_path(
    models: dict[str, Path],
) -> None:
    """input_tokenizer set: decode, re-render with the RM's template, re-tokenise. With the same vocabulary
    and a template that ends the assistant turn with EOS, that is the same sequence, so the same scores."""
    data = rollout_batch(build_toy_tokenizer(), PAIRS[:5])  # all end with EOS
    direct = worker(models["tight"], models["policy"]).compute_rm_score(data).batch["rm_scores"]
    rendered = (
        worker(
            models["tight"],
            models["policy"],
            f"reward_model.model.input_tokenizer={models['policy']}",
            "data.return_raw_chat=true",
            "reward_model.micro_batch_size_per_gpu=2",
        )
        .compute_rm_score(data)
        .batch["rm_scores"]
    )
    assert torch.allclose(rendered, direct, atol=1e-5)
    # The stock template adds a newline after the turn: a different sequence, a different score.
    stock = (
        worker(
            models["token"],
            models["policy"],
            f"reward_model.model.input_tokenizer={models['policy']}",
            "data.return_raw_chat=true",
        )
        .compute_rm_score(data)
        .batch["rm_scores"]
    )
    assert torch.equal(stock != 0, direct != 0) and not torch.allclose(stock, direct, atol=1e-3)


def test_the_reward_model_workers_are_profiled_like_the_others(models: dict[str, Path], tmp_path: Path) -> None:
    """reward_model.profiler: a torch trace of the profiled step, the scoring call a labelled region of it."""
    import gzip
    import json

    from hybridflow import storage

    w = worker(models["token"], models["policy"], f"trainer.default_local_dir={tmp_path}", "global_profiler.tool=torch",
               "global_profiler.steps=[2]", "reward_model.profiler.enable=true", "reward_model.profiler.ranks=[0]")
    data = rollout_batch(build_toy_tokenizer(), PAIRS)
    w.start_profile("global_step_2")
    scores = w.compute_rm_score(data).batch["rm_scores"]
    (uri,) = w.stop_profile()
    assert uri == f"{tmp_path}/profile/global_step_2/reward_model_rank0.json.gz" and scores.shape == (len(PAIRS), 6)
    names = {e.get("name") for e in json.loads(gzip.decompress(storage.read_bytes(uri)))["traceEvents"]}
    assert "reward_model.compute_rm_score" in names


def test_a_causal_lm_is_refused_as_reward_model(models: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="no 'score' head .* point it at a reward model"):
        worker(models["policy"], models["policy"])


def test_trainer_phase_scores_samples_and_the_remax_baseline_with_the_reward_model(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """The trainer's generate-and-score phase in one process (workers called directly, no Ray): the
    responses and ReMax's greedy baseline are both scored by the reward model, timed as timing_s/rm."""
    from hybridflow.data import RLHFDataset
    from hybridflow.data.dataset import collate_fn
    from hybridflow.data.toy import write_parquet
    from hybridflow.demo import build_copy_letter_rows
    from hybridflow.rewards import RewardManager
    from hybridflow.trainer.ray_trainer import RayPPOTrainer, WorkerGroups
    from hybridflow.workers.fsdp_workers import ActorRolloutRefWorker

    write_parquet(build_copy_letter_rows(4, "train"), str(tmp_path / "train.parquet"))
    tok = build_toy_tokenizer()
    dataset = RLHFDataset(str(tmp_path / "train.parquet"), tok, max_prompt_length=16, return_raw_chat=True)
    batch = collate_fn([dataset[i] for i in range(4)])
    cfg = load_config(
        None,
        [
            f"actor_rollout_ref.model.path={models['policy']}",
            f"data.train_files={tmp_path / 'train.parquet'}",
            "data.max_prompt_length=16",
            "data.max_response_length=3",
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.rollout.n=2",
            "algorithm.adv_estimator=remax",
            "trainer.device=cpu",
            "trainer.n_gpus_per_node=1",
            "trainer.total_training_steps=1",
            "reward_model.enable=true",
            f"reward_model.model.path={models['constant']}",
            f"reward_model.model.input_tokenizer={models['policy']}",
            "data.return_raw_chat=true",
        ],
    )
    rollout = ActorRolloutRefWorker(cfg, role="rollout")
    rollout.init_model()
    rm = RewardModelWorker(cfg)
    rm.init_model()
    trainer = RayPPOTrainer(
        cfg, tok, WorkerGroups(actor_rollout=rollout, reward_model=rm), [batch], RewardManager(tok)
    )
    timings: dict[str, float] = {}
    scored, _ = trainer._generate_and_score({}, timings)
    assert timings["rm"] > 0 and len(scored) == 8
    lengths = scored.batch["response_mask"].sum(-1)
    assert torch.allclose(scored.batch["token_level_scores"].sum(-1), torch.full((8,), CONSTANT))
    assert torch.equal(
        scored.batch["token_level_scores"] != 0, torch.nn.functional.one_hot(lengths - 1, 3).bool()
    )
    assert torch.allclose(scored.batch["reward_baselines"], torch.full((8,), CONSTANT))


# ---- through the trainer: 2 CPU workers, GRPO, 2 steps ------------------------------------------------


@pytest.fixture(scope="module")
def ray_inputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    from hybridflow.demo import prepare

    with local_ray(2):
        yield prepare(tmp_path_factory.mktemp("rm_run"))


@pytest.mark.ray
@pytest.mark.slow
def test_grpo_run_is_scored_by_the_reward_model(ray_inputs: dict[str, str], tmp_path: Path) -> None:
    from hybridflow.demo import EXAMPLE
    from hybridflow.trainer import main_ppo

    rm = save_reward_model(
        Path(ray_inputs["actor_rollout_ref.model.path"]), tmp_path / "rm", constant=CONSTANT
    )
    args = [f"{k}={v}" for k, v in ray_inputs.items()] + [f"trainer.default_local_dir={tmp_path / 'ckpt'}"]
    overrides = [
        "data.train_batch_size=8",
        "data.val_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.n=4",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=2",
        "trainer.save_freq=-1",
        "reward_model.enable=true",
        f"reward_model.model.path={rm}",
        # re-rendered inputs: raw chats travel through the batch to both reward-model ranks
        f"reward_model.model.input_tokenizer={ray_inputs['actor_rollout_ref.model.path']}",
        "data.return_raw_chat=true",
        "reward_model.micro_batch_size_per_gpu=4",
        # its own pool of two slots (verl's enable_resource_pool), apart from the two actor workers
        "reward_model.enable_resource_pool=true", "reward_model.nnodes=1", "reward_model.n_gpus_per_node=2",
    ]
    assert main_ppo.main([str(EXAMPLE), *args, *overrides]) == 0
    rows = [json.loads(line) for line in (tmp_path / "ckpt" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["timing_s/rm"] > 0
        # every response scored CONSTANT by the reward model; the copy rule could only give 0 or 1 each
        assert row["critic/score/mean"] == pytest.approx(CONSTANT, abs=1e-6)
        assert row["critic/score/min"] == pytest.approx(CONSTANT, abs=1e-6)
    assert rows[-1]["val-core/toy/copy/reward/mean@1"] == pytest.approx(CONSTANT, abs=1e-6)
