"""A teacher that solves the demo's "copy one letter" task, for the distillation tests: a short supervised fit.

`train_copy_letter_teacher(student_dir, out_dir)` starts from the student's random-init model folder, trains
it with cross-entropy on the answer letter of every prompt the task has (5 letters), in plain torch in the
test process (~100 steps, a few seconds), saves it as a Hugging Face folder and returns its greedy accuracy on the task.
Distilling from it must teach a fresh student the task although no task reward is used.
"""

from __future__ import annotations

from pathlib import Path

from hybridflow.demo import LETTERS


def _prompt_ids(tokenizer: object, letter: str) -> list[int]:
    """The prompt the trainer's dataset renders for `copy <letter>` (chat template, generation prompt)."""
    messages = [{"role": "user", "content": f"copy {letter}"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)  # type: ignore[attr-defined]
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])  # type: ignore[operator]


def train_copy_letter_teacher(
    student_dir: Path, out_dir: Path, max_steps: int = 400, lr: float = 5e-3, target_loss: float = 0.05
) -> float:
    """Fit the model at `student_dir` to answer each `copy x` with `x` until the mean cross-entropy is below
    `target_loss` (a confident teacher: p(answer) > ~0.95) or `max_steps`; save to `out_dir`; return greedy accuracy."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 5-row batch: more threads only contend with the box's other work
    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    model = AutoModelForCausalLM.from_pretrained(student_dir, dtype=torch.float32)
    prompts = [_prompt_ids(tokenizer, letter) for letter in LETTERS]
    assert len({len(p) for p in prompts}) == 1, "every copy prompt has the same length (one letter)"
    inputs = torch.tensor(prompts)
    targets = torch.tensor([tokenizer.convert_tokens_to_ids(letter) for letter in LETTERS])
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(max_steps):
        logits = model(input_ids=inputs).logits[:, -1, :]
        loss = torch.nn.functional.cross_entropy(logits, targets)
        if loss.item() < target_loss:
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(input_ids=inputs).logits[:, -1, :].argmax(-1) == targets).float().mean())
    torch.set_num_threads(threads)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return accuracy
