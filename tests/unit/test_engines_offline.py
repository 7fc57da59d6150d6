"""The offline learner's gradients on a real (unsharded) FSDP engine equal independent references.

DPO and IPO against a loss written from the papers' formulas on the plain Hugging Face model, token by token;
SFT against transformers' own causal-LM loss (`labels`, -100 outside the response). Micro-batches of uneven
size and left padding are part of the batch, so the loss scaling and the target positions are checked too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.data.preference import PreferenceDataset, build_preference_rows
from hybridflow.data.sft_dataset import SFTDataset
from hybridflow.data.toy import build_rows, write_parquet
from hybridflow.engines.fsdp_engine import FSDPEngine
from hybridflow.engines.offline import DpoObjective, OfflineLearner, SftObjective
from hybridflow.models.tiny import build_tiny_model
from hybridflow.protocol import DataProto

BETA = 0.5


def as_batch(dataset: SFTDataset | PreferenceDataset) -> DataProto:
    """Every item of a dataset as one batch (what the data loader's collate builds)."""
    items = [dataset[i] for i in range(len(dataset))]
    return DataProto.from_dict({k: torch.stack([it[k] for it in items]) for k in items[0]})


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model folder and the toy copy task's rows (responses of 1-3 letters: uneven lengths)."""
    root = Path(tmp_path_factory.mktemp("offline"))
    build_tiny_model(root / "model", seed=0)
    rows = build_rows("copy", 4, seed=3)
    write_parquet(rows, str(root / "rows.parquet"))
    write_parquet(build_preference_rows(rows), str(root / "pairs.parquet"))
    return root


@pytest.fixture(scope="module")
def setup(root: Path) -> tuple[str, DataProto]:
    """The model and 4 preference pairs."""
    tokenizer = AutoTokenizer.from_pretrained(root / "model")
    batch = as_batch(PreferenceDataset(str(root / "pairs.parquet"), tokenizer, max_length=32))
    assert len({int(m.sum()) for m in batch.batch["chosen_loss_mask"]}) > 1  # uneven lengths exercise the padding
    return str(root / "model"), batch


def _logp(model: torch.nn.Module, ids: torch.Tensor, loss_mask: torch.Tensor, average: bool) -> torch.Tensor:
    """log pi(response | prompt) of one unpadded sequence, target by target (IPO: the mean over targets)."""
    logits = model(input_ids=ids[None]).logits[0].float()
    total, count = torch.zeros(()), 0
    for t in range(1, len(ids)):
        if loss_mask[t]:
            total = total + torch.log_softmax(logits[t - 1], dim=-1)[ids[t]]
            count += 1
    return total / count if average else total


def hand_written_loss(policy: torch.nn.Module, reference: torch.nn.Module, batch: DataProto, loss_type: str) -> torch.Tensor:
    """The mean DPO (or IPO) loss of the pairs, written from the papers' formulas."""
    losses = []
    for i in range(len(batch)):
        ratios = []
        for side in ("chosen", "rejected"):
            real = batch.batch[f"{side}_attention_mask"][i].bool()
            ids, mask = batch.batch[f"{side}_input_ids"][i][real], batch.batch[f"{side}_loss_mask"][i][real]
            with torch.no_grad():
                ref = _logp(reference, ids, mask, loss_type == "ipo")
            ratios.append(_logp(policy, ids, mask, loss_type == "ipo") - ref)
        h = ratios[0] - ratios[1]
        if loss_type == "sigmoid":
            losses.append(-F.logsigmoid(BETA * h))  # Rafailov et al. 2023, eq. 7
        else:
            losses.append((h - 1 / (2 * BETA)) ** 2)  # Azar et al. 2023, eq. 17
    return torch.stack(losses).mean()


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_gradient_equals_the_hand_written_loss_gradient(setup: tuple[str, DataProto], loss_type: str) -> None:
    path, batch = setup
    policy = FSDPEngine(path, optim_config={"lr": 1e-3}, total_steps=4)
    reference = FSDPEngine(path)
    with torch.no_grad():  # move the policy off the reference, so the margins (and gradients) are not trivial
        for p in policy.module.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    learner = OfflineLearner(policy, DpoObjective(reference, BETA, loss_type))
    stats = learner.accumulate_gradients(batch, micro_batch_size=3)  # micro-batches of 3 + 1 pairs
    engine_grads = {n: p.grad.clone() for n, p in policy.module.named_parameters()}

    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    plain.load_state_dict(policy.module.state_dict())
    frozen = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    loss = hand_written_loss(plain, frozen, batch, loss_type)
    loss.backward()

    assert stats["loss"].mean().item() == pytest.approx(loss.item(), rel=1e-5)
    diff = max((engine_grads[n] - p.grad).abs().max().item() for n, p in plain.named_parameters())
    scale = max(p.grad.abs().max().item() for p in plain.parameters())
    assert scale > 1e-4  # a real gradient, not zeros on both sides
    assert diff <= 1e-5 * max(1.0, scale), f"max |grad diff| {diff:.2e} (max |grad| {scale:.2e})"


def test_sft_gradient_equals_transformers_causal_lm_loss_gradient(root: Path) -> None:
    path = str(root / "model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    batch = as_batch(SFTDataset(str(root / "rows.parquet"), tokenizer, prompt_key="prompt", response_key="reward_model",
                                response_dict_keys=["ground_truth"], max_length=32))
    engine = FSDPEngine(path, optim_config={"lr": 1e-3}, total_steps=4)
    stats = OfflineLearner(engine, SftObjective()).accumulate_gradients(batch, micro_batch_size=3)
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    b = batch.batch
    labels = torch.where(b["loss_mask"].bool(), b["input_ids"], torch.full_like(b["input_ids"], -100))
    loss = plain(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"],
                 labels=labels).loss  # the token mean over every label of the batch
    loss.backward()
    assert float(stats["nll"].sum() / stats["tokens"].sum()) == pytest.approx(loss.item(), rel=1e-5)
    grads = dict(engine.module.named_parameters())
    diff = max((grads[n].grad - p.grad).abs().max().item() for n, p in plain.named_parameters())
    assert diff <= 1e-5, f"max |grad diff| {diff:.2e}"
