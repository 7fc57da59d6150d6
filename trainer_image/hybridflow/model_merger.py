"""Export a checkpoint as a Hugging Face model folder (verl's `model_merger` command shape).

    python -m hybridflow.model_merger merge --backend fsdp --local_dir <root>/global_step_N/actor --target_dir DIR
    python -m hybridflow.model_merger test  --backend fsdp --local_dir <root>/global_step_N/actor --test_hf_dir DIR

`--local_dir` and `--target_dir` are paths or object-storage URIs (`s3://bucket/run/global_step_N/actor`,
read and written through `hybridflow.storage`, so the AWS variables configure S3 as for the trainer). The
target becomes a folder `from_pretrained` and vLLM load: `config.json`, `generation_config.json`, safetensors
shards (`--max_shard_size`, with `model.safetensors.index.json` when there are several) and the tokenizer.
A LoRA checkpoint (`lora_adapter/` instead of `model.pt`) gives the merged model there plus the peft adapter
in `<target>/lora_adapter/` (`PeftModel.from_pretrained(base, <target>/lora_adapter)`); its base weights come
from the adapter's `base_model_name_or_path` (the run's `model.path`) or `--hf_model_path`.

The checkpoint's `huggingface/` folder supplies config, tokenizer and generation config (the trainer writes
it with every checkpoint); `--hf_model_path` is the fallback for checkpoints without them. `test` merges in
memory and compares every tensor with the folder at `--test_hf_dir`. Exit status: 0 done, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hybridflow import storage
from hybridflow.data.vision import is_vision_config, save_processor

HF_DIR = "huggingface"
MODEL_FILE = "model.pt"
ADAPTER_DIR = "lora_adapter"
ADAPTER_CONFIG_FILE = "adapter_config.json"
_DTYPES = ("auto", "bfloat16", "float16", "float32")
#: What a merge reads from a checkpoint folder (never the optimizer state, the largest file).
_NEEDED = (HF_DIR, ADAPTER_DIR, MODEL_FILE)


class MergeError(ValueError):
    """The checkpoint cannot be exported as asked; the message says what is missing and what to pass."""


@dataclass(frozen=True)
class MergeResult:
    """What a merge wrote."""

    target: str
    lora: bool
    files: tuple[str, ...]


def _is_uri(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def _local(location: str) -> str:
    return location[len("file://"):] if location.startswith("file://") else location


@contextmanager
def staged_checkpoint(local_dir: str) -> Iterator[str]:
    """A local folder with the checkpoint's model files: the folder itself, or a download of a URI's."""
    if not _is_uri(local_dir):
        path = _local(local_dir)
        if not os.path.isdir(path):
            raise MergeError(f"--local_dir {local_dir}: no such folder; pass a checkpoint's actor folder "
                             "(<trainer.default_local_dir>/global_step_N/actor)")
        yield path
        return
    fs, root = storage.open_fs(local_dir)
    root = root.rstrip("/")
    if not storage.with_retries(lambda: fs.exists(root), f"checking {local_dir}"):
        raise MergeError(f"--local_dir {local_dir}: nothing there; pass a checkpoint's actor folder "
                         "(<trainer.default_local_dir>/global_step_N/actor)")
    scheme = local_dir.split("://", 1)[0]
    with tempfile.TemporaryDirectory(prefix="hybridflow-merge-") as tmp:
        for name in _NEEDED:
            remote = f"{scheme}://{root}/{name}"
            if not storage.with_retries(lambda r=f"{root}/{name}": fs.exists(r), f"checking {remote}"):
                continue
            if storage.with_retries(lambda r=f"{root}/{name}": fs.isdir(r), f"checking {remote}"):
                storage.download_dir(remote, os.path.join(tmp, name))
            else:
                storage.download_file(remote, os.path.join(tmp, name))
        yield tmp


def _auto_class(config: Any) -> Any:
    """The transformers Auto class of a checkpoint's architecture (causal LM, a vision-language model, or a critic's
    value head)."""
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForTokenClassification,
    )

    arch = (getattr(config, "architectures", None) or [""])[0]
    if arch.endswith("ForTokenClassification"):
        return AutoModelForTokenClassification
    if is_vision_config(config):
        return AutoModelForImageTextToText
    if arch.endswith("ForCausalLM") or not arch:
        return AutoModelForCausalLM
    raise MergeError(f"architecture {arch} is neither a causal LM nor a token-classification value model; "
                     "HybridFlow checkpoints hold one of those")


def _metadata_source(ckpt: str, hf_model_path: str | None, what: str, present: Callable[[str], bool]) -> str:
    """Where config / tokenizer / generation config come from: the checkpoint's huggingface/, else --hf_model_path."""
    own = os.path.join(ckpt, HF_DIR)
    if present(own):
        return own
    if hf_model_path:
        return hf_model_path
    raise MergeError(
        f"the checkpoint has no {HF_DIR}/{what} (it predates the trainer writing one); pass --hf_model_path with "
        "the model folder the run started from"
    )


def _has_config(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "config.json"))


def _has_tokenizer(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, f)) for f in ("tokenizer.json", "tokenizer_config.json",
                                                                  "tokenizer.model", "vocab.json"))


def _dtype(name: str, config: Any) -> Any:
    import torch

    if name == "auto":
        saved = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if isinstance(saved, str):
            saved = getattr(torch, saved, None)
        return saved if isinstance(saved, torch.dtype) else torch.float32
    return getattr(torch, name)


def build_merged_model(ckpt: str, *, hf_model_path: str | None = None, dtype: str = "auto") -> tuple[Any, bool]:
    """The checkpoint's model as a plain transformers model (LoRA folded in) and whether it was LoRA."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(_metadata_source(ckpt, hf_model_path, "config.json", _has_config))
    target_dtype = _dtype(dtype, config)
    cls = _auto_class(config)
    adapter = os.path.join(ckpt, ADAPTER_DIR)
    if os.path.isfile(os.path.join(adapter, ADAPTER_CONFIG_FILE)):
        from peft import PeftModel

        with open(os.path.join(adapter, ADAPTER_CONFIG_FILE), encoding="utf-8") as handle:
            base = hf_model_path or json.load(handle).get("base_model_name_or_path")
        if not base:
            raise MergeError(f"{adapter}/{ADAPTER_CONFIG_FILE} names no base model; pass --hf_model_path with the "
                             "model folder the LoRA run trained on")
        try:
            # merged in the trainer's precision (the config's dtype), then cast: bf16 bases merge exactly as trained
            model = cls.from_pretrained(base, config=config, dtype=_dtype("auto", config))
        except OSError as exc:
            raise MergeError(f"cannot load the LoRA base model {base!r} ({exc}); pass --hf_model_path with the "
                             "model folder the run trained on") from exc
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        return model.to(target_dtype), True
    weights = os.path.join(ckpt, MODEL_FILE)
    if not os.path.isfile(weights):
        raise MergeError(f"{ckpt} holds neither {MODEL_FILE} nor {ADAPTER_DIR}/: it was saved without the model "
                         "(checkpoint.save_contents lacks model) or is not an actor/critic checkpoint folder")
    from accelerate import init_empty_weights

    state = torch.load(weights, map_location="cpu", weights_only=True)
    with init_empty_weights():  # parameters on the meta device until the checkpoint's tensors take their place
        model = cls.from_config(config)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise MergeError(f"{weights} does not fit {type(model).__name__}: missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}; the checkpoint's {HF_DIR}/config.json (or --hf_model_path) must be the "
                         "trained model's")
    model.tie_weights()
    return model.to(target_dtype), False


#: Files an export writes that a new export with other shards must not leave behind.
_WEIGHT_PATTERNS = ("*.safetensors", "model.safetensors.index.json", f"{ADAPTER_DIR}/*")


def _clear(target: str) -> None:
    """Remove a previous export's weight files at `target` (stale shards would mix with new ones); nothing else."""
    if _is_uri(target):
        fs, path = storage.open_fs(target)
        stale = [f for pattern in _WEIGHT_PATTERNS
                 for f in storage.with_retries(lambda p=pattern: fs.glob(f"{path.rstrip('/')}/{p}"), f"listing {target}")]
        for file in stale:
            storage.with_retries(lambda f=file: fs.rm(f), f"removing {file}")
        return
    import glob

    for pattern in _WEIGHT_PATTERNS:
        for file in glob.glob(os.path.join(_local(target), pattern)):
            os.remove(file)


def write_folder(model: Any, ckpt: str, out: str, *, hf_model_path: str | None, max_shard_size: str,
                 lora: bool) -> None:
    """Save model, generation config, tokenizer (and the LoRA adapter) as a Hugging Face folder at `out`."""
    from transformers import AutoTokenizer, GenerationConfig

    source = _metadata_source(ckpt, hf_model_path, "config.json", _has_config)
    try:
        model.generation_config = GenerationConfig.from_pretrained(source)
    except OSError:
        pass  # none saved: save_pretrained writes the one transformers derives from the config
    model.save_pretrained(out, max_shard_size=max_shard_size, safe_serialization=True)
    tok_source = _metadata_source(ckpt, hf_model_path, "tokenizer", _has_tokenizer)
    AutoTokenizer.from_pretrained(tok_source).save_pretrained(out)
    save_processor(tok_source, out)
    if lora:
        shutil.copytree(os.path.join(ckpt, ADAPTER_DIR), os.path.join(out, ADAPTER_DIR))


def merge(local_dir: str, target_dir: str, *, hf_model_path: str | None = None, max_shard_size: str = "5GB",
          dtype: str = "auto", log: Callable[[str], None] = print) -> MergeResult:
    """Export the checkpoint folder `local_dir` as a Hugging Face folder at `target_dir` (both paths or URIs)."""
    with staged_checkpoint(local_dir) as ckpt:
        model, is_lora = build_merged_model(ckpt, hf_model_path=hf_model_path, dtype=dtype)
        with tempfile.TemporaryDirectory(prefix="hybridflow-export-") as tmp:
            write_folder(model, ckpt, tmp, hf_model_path=hf_model_path, max_shard_size=max_shard_size, lora=is_lora)
            del model
            _clear(target_dir)
            if _is_uri(target_dir):
                written = storage.upload_dir(tmp, target_dir)
            else:
                shutil.copytree(tmp, _local(target_dir), dirs_exist_ok=True)
                written = [os.path.join(_local(target_dir), os.path.relpath(os.path.join(d, f), tmp))
                           for d, _, files in os.walk(tmp) for f in files]
    kind = "merged LoRA model + adapter in lora_adapter/" if is_lora else "model"
    log(f"model_merger: wrote a Hugging Face folder ({kind}, {len(written)} files) to {target_dir}")
    return MergeResult(target_dir, is_lora, tuple(sorted(written)))


def compare(local_dir: str, test_hf_dir: str, *, hf_model_path: str | None = None, atol: float = 1e-5) -> list[str]:
    """verl's `test`: the merged weights against a reference folder; the differences found (empty: equal)."""
    import torch

    with staged_checkpoint(local_dir) as ckpt:
        model, _ = build_merged_model(ckpt, hf_model_path=hf_model_path, dtype="float32")
    reference = _auto_class(model.config).from_pretrained(test_hf_dir, dtype=torch.float32)
    ours, theirs = model.state_dict(), reference.state_dict()
    problems = [f"{k}: only in {test_hf_dir}" for k in sorted(set(theirs) - set(ours))]
    problems += [f"{k}: only in the checkpoint" for k in sorted(set(ours) - set(theirs))]
    for key in sorted(set(ours) & set(theirs)):
        a, b = ours[key].float(), theirs[key].float()
        if a.shape != b.shape:
            problems.append(f"{key}: shape {tuple(a.shape)} vs {tuple(b.shape)}")
        elif not torch.allclose(a, b, atol=atol, rtol=0):
            problems.append(f"{key}: max |diff| {float((a - b).abs().max()):.3g} > {atol}")
    return problems


def export_final_checkpoint(cfg: Any, step: int, log: Callable[[str], None] = print) -> str:
    """`trainer.export`: merge the run's committed final step into a Hugging Face folder, record it in progress.json.

    Called by the trainer after the last step (its checkpoint is committed by then); returns the folder's URI.
    """
    from hybridflow import checkpoint as ck
    from hybridflow import progress
    from hybridflow._config.export import export_uri

    root = str(cfg.trainer.default_local_dir)
    step_uri = ck.step_dir(root, step)
    problem = ck.verify_step(step_uri, deep=False)
    if problem is not None:
        raise MergeError(f"trainer.export: the final checkpoint {step_uri} cannot be exported ({problem}); "
                         "rerun with trainer.resume_mode=auto to save it again")
    target = export_uri(cfg, step)
    result = merge(f"{step_uri}/actor", target, max_shard_size=cfg.trainer.export.max_shard_size, log=log)
    progress.record_export(root, step, target, lora=result.lora)
    return target


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """verl's model_merger arguments (merge | test), plus --max_shard_size and --dtype."""
    parser = argparse.ArgumentParser(prog="python -m hybridflow.model_merger", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="operation", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--backend", required=True, choices=["fsdp", "megatron"], help="checkpoint format: fsdp")
    common.add_argument("--local_dir", required=True, help="a checkpoint's actor folder (path or URI)")
    common.add_argument("--hf_model_path", default=None,
                        help="the model folder the run started from: LoRA base weights, and config/tokenizer for "
                        "checkpoints without huggingface/")
    for flag in ("--tie-word-embedding", "--is-value-model", "--use_cpu_initialization"):
        common.add_argument(flag, action="store_true", help="accepted for verl; read from the checkpoint's config here")
    merge_parser = sub.add_parser("merge", parents=[common], help="write a Hugging Face folder")
    merge_parser.add_argument("--target_dir", default="tmp", help="output folder (path or URI)")
    merge_parser.add_argument("--max_shard_size", default="5GB", help="largest safetensors file, e.g. 5GB")
    merge_parser.add_argument("--dtype", default="auto", choices=_DTYPES, help="weight dtype (auto: as trained)")
    merge_parser.add_argument("--hf_upload_path", default=None, help="not supported here (no upload)")
    merge_parser.add_argument("--private", action="store_true", help="not supported here (no upload)")
    test_parser = sub.add_parser("test", parents=[common], help="compare with a reference Hugging Face folder")
    test_parser.add_argument("--test_hf_dir", required=True, help="reference folder")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; problems with the input print one line and exit 2."""
    args = parse_args(argv)
    try:
        if args.backend != "fsdp":
            raise MergeError("--backend megatron: HybridFlow trains with FSDP2 only; its checkpoints are --backend fsdp")
        if args.operation == "merge":
            if args.hf_upload_path or args.private:
                raise MergeError("--hf_upload_path: uploading is not built in; merge to --target_dir, then upload the "
                                 "folder with `hf upload <repo> <target_dir>`")
            merge(args.local_dir, args.target_dir, hf_model_path=args.hf_model_path,
                  max_shard_size=args.max_shard_size, dtype=args.dtype)
            return 0
        problems = compare(args.local_dir, args.test_hf_dir, hf_model_path=args.hf_model_path)
    except MergeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if problems:
        print(f"model_merger test: {len(problems)} differences:\n  " + "\n  ".join(problems[:20]), file=sys.stderr)
        return 1
    print(f"model_merger test: the merged checkpoint equals {args.test_hf_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
