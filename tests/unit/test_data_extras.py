"""verl's data extras for real: a user dataset class and a (curriculum) sampler loaded by path, chat-template
keyword arguments, the full prompt text, and DAPO's generation batch size; each against the plain path."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hybridflow.config import ConfigError, load_config
from hybridflow.data.dataset import RLHFDataset
from hybridflow.data.external import ExternalClassError, ExternalDataset
from hybridflow.data.sampler import StatefulDataLoader
from hybridflow.data.toy import build_toy_tokenizer, write_parquet
from hybridflow.trainer.ray_trainer import RayPPOTrainer

QUESTIONS = ["1+2=", "ab", "7", "9-3=", "xy", "5"]

# A user dataset written against verl's contract: its own parquet layout ("question" column), rendered as verl does.
USER_DATASET = '''
import pandas as pd
import torch
from hybridflow.data.dataset import left_pad


class QuestionDataset(torch.utils.data.Dataset):
    def __init__(self, data_files, tokenizer, processor=None, config=None):
        self.rows = pd.concat([pd.read_parquet(f) for f in data_files]).to_dict("records")
        self.tokenizer, self.length = tokenizer, config.max_prompt_length
        self.kwargs = config.get("apply_chat_template_kwargs", {})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = self.rows[i]
        chat = [{"role": "user", "content": row["question"]}]
        text = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False, **self.kwargs)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        input_ids, mask, pos = left_pad(ids, self.length, self.tokenizer.pad_token_id)
        return {"input_ids": input_ids, "attention_mask": mask, "position_ids": pos, "raw_prompt_ids": ids,
                "data_source": row["source"], "reward_model": {"ground_truth": row["answer"]}, "index": i}


class NotADataset:
    def __init__(self, **kwargs):
        pass


class MissingKeys(torch.utils.data.Dataset):
    def __init__(self, data_files, tokenizer, processor=None, config=None):
        pass

    def __len__(self):
        return 1

    def __getitem__(self, i):
        return {"input_ids": torch.zeros(3, dtype=torch.long)}
'''

# verl's sampler contract: (data_source, data_config); iterating yields indices; update(batch) makes it a curriculum.
USER_SAMPLER = '''
class Reversed:
    def __init__(self, data_source, data_config):
        self.n = len(data_source)

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self):
        return self.n


class Curriculum:
    """Serves the lowest-scored index next; every index it was told about moves to the back."""

    def __init__(self, data_source, data_config):
        self.n = len(data_source)
        self.seen = []
        self.updates = 0

    def __iter__(self):
        while True:
            fresh = [i for i in range(self.n) if i not in self.seen]
            order = fresh + self.seen
            i = order[0]
            self.seen = [j for j in self.seen if j != i] + [i]
            yield i

    def __len__(self):
        return self.n

    def update(self, batch):
        self.updates += 1

    def state_dict(self):
        return {"seen": list(self.seen), "updates": self.updates}

    def load_state_dict(self, state):
        self.seen, self.updates = list(state["seen"]), state["updates"]
'''


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_toy_tokenizer()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """The same prompts twice: the user's own layout, and verl's (what RLHFDataset reads)."""
    user, verl = str(tmp_path / "questions.parquet"), str(tmp_path / "verl.parquet")
    write_parquet([{"question": q, "source": "toy/arithmetic", "answer": str(i)} for i, q in enumerate(QUESTIONS)], user)
    write_parquet([{"data_source": "toy/arithmetic", "prompt": [{"role": "user", "content": q}],
                    "reward_model": {"style": "rule", "ground_truth": str(i)}, "extra_info": {"index": i}}
                   for i, q in enumerate(QUESTIONS)], verl)
    (tmp_path / "user_dataset.py").write_text(USER_DATASET)
    (tmp_path / "user_sampler.py").write_text(USER_SAMPLER)
    return {"user": user, "verl": verl, "dataset": str(tmp_path / "user_dataset.py"),
            "sampler": str(tmp_path / "user_sampler.py")}


def _cfg(*overrides: str) -> Any:
    return load_config(None, ["trainer.n_gpus_per_node=1", "data.train_batch_size=2",
                              "actor_rollout_ref.actor.ppo_mini_batch_size=2", "data.max_prompt_length=16", *overrides])


def test_custom_dataset_class_yields_what_rlhf_dataset_yields_for_the_same_prompts(files: dict, tokenizer: Any) -> None:
    cfg = _cfg(f"data.train_files={files['user']}", f"data.custom_cls.path={files['dataset']}",
               "data.custom_cls.name=QuestionDataset")
    custom = RLHFDataset.from_config(cfg, tokenizer)
    assert isinstance(custom, ExternalDataset) and len(custom) == len(QUESTIONS)
    plain = RLHFDataset.from_config(_cfg(f"data.train_files={files['verl']}"), tokenizer)
    for i in range(len(QUESTIONS)):
        assert custom[i]["raw_prompt_ids"] == plain[i]["raw_prompt_ids"]
        assert custom[i]["input_ids"].tolist() == plain[i]["input_ids"].tolist()
    assert custom.data_sources() == plain.data_sources() == ["toy/arithmetic"]
    batch = next(iter(StatefulDataLoader.from_config(cfg, custom)))
    assert batch.batch["input_ids"].shape == (2, 16)


@pytest.mark.parametrize(("name", "message"), [
    ("Nope", "no class 'Nope'"),
    ("NotADataset", "must subclass torch.utils.data.Dataset"),
    ("MissingKeys", "its items lack attention_mask, position_ids, raw_prompt_ids, data_source, reward_model"),
])
def test_a_wrong_dataset_class_says_what_to_fix(files: dict, tokenizer: Any, name: str, message: str) -> None:
    cfg = _cfg(f"data.train_files={files['user']}", f"data.custom_cls.path={files['dataset']}",
               f"data.custom_cls.name={name}")
    with pytest.raises(ExternalClassError, match=message):
        RLHFDataset.from_config(cfg, tokenizer)


def test_custom_cls_needs_both_keys() -> None:
    with pytest.raises(ConfigError, match="data.custom_cls: set both path"):
        _cfg("data.custom_cls.path=x.py")


def test_a_sampler_decides_the_order_and_resumes_by_replay(files: dict, tokenizer: Any) -> None:
    cfg = _cfg(f"data.train_files={files['verl']}", f"data.sampler.class_path={files['sampler']}",
               "data.sampler.class_name=Reversed")
    dataset = RLHFDataset.from_config(cfg, tokenizer)
    loader = StatefulDataLoader.from_config(cfg, dataset)
    epoch = [b.non_tensor_batch["index"].tolist() for b in loader]
    assert epoch == [[5, 4], [3, 2], [1, 0]] and loader.epoch == 1  # the sampler's order, not the seeded shuffle
    first = StatefulDataLoader.from_config(cfg, dataset)
    it = iter(first)
    next(it)
    resumed = StatefulDataLoader.from_config(cfg, dataset)
    resumed.load_state_dict(first.state_dict())  # the sampler keeps no state: its order is replayed
    assert [b.non_tensor_batch["index"].tolist() for b in resumed] == [[3, 2], [1, 0]]


def test_a_curriculum_sampler_sees_each_steps_batch_and_its_state_is_kept(files: dict, tokenizer: Any) -> None:
    cfg = _cfg(f"data.train_files={files['verl']}", f"data.sampler.class_path={files['sampler']}",
               "data.sampler.class_name=Curriculum")
    dataset = RLHFDataset.from_config(cfg, tokenizer)
    loader = StatefulDataLoader.from_config(cfg, dataset)
    trainer = SimpleNamespace(train_dataloader=loader, streaming=False)
    batches = []
    for batch in loader:
        batches.append(batch.non_tensor_batch["index"].tolist())
        RayPPOTrainer._update_curriculum(trainer, batch)  # type: ignore[arg-type]  # what train_step does
        if len(batches) == 2:
            break
    assert batches == [[0, 1], [2, 3]] and loader.sampler.updates == 2
    state = loader.state_dict()
    assert state["sampler_state"] == {"seen": [0, 1, 2, 3], "updates": 2}
    resumed = StatefulDataLoader.from_config(cfg, dataset)
    resumed.load_state_dict(state)  # the sampler's own state comes back: no replay
    assert resumed.sampler.updates == 2
    assert next(iter(resumed)).non_tensor_batch["index"].tolist() == next(iter(loader)).non_tensor_batch["index"].tolist()


def test_a_sampler_by_pkg_module(files: dict, tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(files["sampler"]).parent))
    cfg = _cfg(f"data.train_files={files['verl']}", "data.sampler.class_path=pkg://user_sampler",
               "data.sampler.class_name=Reversed")
    loader = StatefulDataLoader.from_config(cfg, RLHFDataset.from_config(cfg, tokenizer))
    assert next(iter(loader)).non_tensor_batch["index"].tolist() == [5, 4]
    missing = _cfg(f"data.train_files={files['verl']}", "data.sampler.class_path=pkg://no_such_module_here",
                   "data.sampler.class_name=X")
    with pytest.raises(ExternalClassError, match="importing module 'no_such_module_here' failed"):
        StatefulDataLoader.from_config(missing, RLHFDataset.from_config(missing, tokenizer))


def test_chat_template_kwargs_reach_the_template_and_full_prompts(files: dict) -> None:
    tok = build_toy_tokenizer()
    tok.chat_template = tok.chat_template + "{% if effort %}{{ effort }}{% endif %}"
    cfg = _cfg(f"data.train_files={files['verl']}", "+data.apply_chat_template_kwargs.effort=abc",
               "data.return_full_prompt=true")
    item = RLHFDataset.from_config(cfg, tok)[0]
    chat = [{"role": "user", "content": QUESTIONS[0]}]
    text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False, effort="abc")
    assert text.endswith("abc") and item["full_prompts"] == text
    assert item["raw_prompt_ids"] == tok(text, add_special_tokens=False)["input_ids"]
    plain = RLHFDataset.from_config(_cfg(f"data.train_files={files['verl']}"), tok)[0]
    assert "full_prompts" not in plain and plain["raw_prompt_ids"] != item["raw_prompt_ids"]


def test_chat_template_kwargs_with_the_tool_agent_are_accepted() -> None:
    """The tool agent renders with them too (tests/unit/test_agent_loops.py checks they reach its renders)."""
    cfg = _cfg("+data.apply_chat_template_kwargs.effort=abc", "actor_rollout_ref.rollout.multi_turn.enable=true")
    assert cfg.data.apply_chat_template_kwargs == {"effort": "abc"}


def test_gen_batch_size_sizes_the_dynamic_sampling_draws(files: dict, tokenizer: Any) -> None:
    cfg = _cfg(f"data.train_files={files['verl']}", "data.gen_batch_size=3", "algorithm.filter_groups.enable=true",
               "algorithm.filter_groups.metric=acc", "actor_rollout_ref.rollout.n=2")
    loader = StatefulDataLoader.from_config(cfg, RLHFDataset.from_config(cfg, tokenizer))
    assert loader.batch_size == 3 and len(loader) == 2
    with pytest.raises(ConfigError, match="data.gen_batch_size=3 differs from data.train_batch_size=2"):
        _cfg("data.gen_batch_size=3")
    assert _cfg("data.gen_batch_size=2").data.gen_batch_size == 2  # equal sizes: verl's same-batch case
