"""Rollout with Hugging Face `generate` on an unsharded model copy: the fallback without vLLM/SGLang."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hybridflow.protocol import DataProto
from hybridflow.rollout.base import SAMPLING_KEYS, RolloutEngine, assemble_output, response_mask_from


def _get(cfg: Any, key: str, default: Any) -> Any:
    if cfg is None:
        return default
    value = cfg.get(key, default) if isinstance(cfg, dict) else getattr(cfg, key, default)
    return default if value is None else value


class HFRollout(RolloutEngine):
    """`model.generate` on this process's own full copy of the policy (see `RolloutEngine`)."""

    def __init__(
        self,
        model_path: str,
        config: Any = None,
        device: str | torch.device = "cpu",
        response_length: int | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.device = torch.device(device)
        self.config = config
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(self.device)
        self.model.eval().requires_grad_(False)
        gen_cfg = self.model.generation_config
        self.eos_token_id = gen_cfg.eos_token_id if gen_cfg.eos_token_id is not None else self.model.config.eos_token_id
        pad = gen_cfg.pad_token_id if gen_cfg.pad_token_id is not None else self.model.config.pad_token_id
        if pad is None:
            pad = self.eos_token_id[0] if isinstance(self.eos_token_id, list) else self.eos_token_id
        self.pad_token_id = int(pad if pad is not None else 0)
        self.response_length = int(response_length or _get(config, "response_length", 32))

    def _sampling(self, prompts: DataProto, overrides: dict[str, Any]) -> dict[str, Any]:
        params = {
            "do_sample": bool(_get(self.config, "do_sample", True)),
            "temperature": float(_get(self.config, "temperature", 1.0)),
            "top_p": float(_get(self.config, "top_p", 1.0)),
            "top_k": int(_get(self.config, "top_k", -1)),
            "response_length": self.response_length,
            "calculate_log_probs": bool(_get(self.config, "calculate_log_probs", False)),
        }
        params.update({k: v for k, v in overrides.items() if k in SAMPLING_KEYS})
        params.update({k: v for k, v in prompts.meta_info.items() if k in SAMPLING_KEYS})
        if params["temperature"] <= 0:
            params["do_sample"] = False
        return params

    @torch.no_grad()
    def generate(self, prompts: DataProto, **sampling: Any) -> DataProto:
        """Sample (or greedily decode) one response per row; see `hybridflow.rollout.base`."""
        p = self._sampling(prompts, sampling)
        resp_len = int(p["response_length"])
        input_ids = prompts.batch["input_ids"].to(self.device)
        attention_mask = prompts.batch["attention_mask"].to(self.device)
        kwargs: dict[str, Any] = {
            "max_new_tokens": resp_len,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "do_sample": p["do_sample"],
            "return_dict_in_generate": True,
            "output_logits": bool(p["calculate_log_probs"]),
        }
        if p["do_sample"]:
            kwargs.update(temperature=p["temperature"], top_p=p["top_p"], top_k=p["top_k"] if p["top_k"] > 0 else 0)
        else:  # plain greedy; unset the model's default sampling knobs so HF does not warn
            kwargs.update(temperature=None, top_p=None, top_k=None)
        out = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        generated = out.sequences[:, input_ids.shape[1] :]
        gen_len = generated.shape[1]
        responses = torch.full((len(prompts), resp_len), self.pad_token_id, dtype=generated.dtype, device=self.device)
        responses[:, :gen_len] = generated
        mask = response_mask_from(responses, self.eos_token_id, gen_len)
        log_probs = None
        if p["calculate_log_probs"]:
            # Raw logits of each step / temperature, as the trainer computes them (not HF's warped scores).
            temperature = p["temperature"] if p["temperature"] > 0 else 1.0
            logits = torch.stack(out.logits, dim=1).float() / temperature
            step_lp = torch.log_softmax(logits, dim=-1).gather(-1, generated.unsqueeze(-1)).squeeze(-1)
            log_probs = torch.zeros(len(prompts), resp_len, device=self.device)
            log_probs[:, :gen_len] = step_lp
            log_probs = (log_probs * mask).cpu()
        prompts_cpu = prompts.select(list(prompts.batch), list(prompts.non_tensor_batch), list(prompts.meta_info))
        return assemble_output(prompts_cpu, responses.cpu(), mask.cpu(), log_probs)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the trainer's full weights in (names must match the HF model's; all must be present)."""
        state = {name: tensor for name, tensor in weights}
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        # tied output embeddings may be absent from the trainer's dict; anything else is an error
        missing = [m for m in missing if not (m == "lm_head.weight" and self.model.config.tie_word_embeddings)]
        if missing or unexpected:
            raise KeyError(
                f"HF rollout weight load: missing {missing[:5]} unexpected {unexpected[:5]}; the actor and "
                "rollout must be the same architecture (actor_rollout_ref.model.path)"
            )
