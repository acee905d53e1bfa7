"""Plan-vs-measured cases shared by tests/unit/plan and benchmarks/plan_accuracy.py.

Each case is a small architecture trained for real on CPU with ``training.build`` and the
loop's own step (``training.step``: forward, backward of loss / items, clip, update), while
``monitor.memory.CpuMemoryMeter`` counts live tensor storages; the measured peak of the
steady-state steps is compared with ``plan.estimate``'s ``peak_tensor_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from memfit.config.schema import Config, GaloreProjector
from memfit.techniques import registry
from memfit.techniques.config_checks import from_mapping
from memfit.techniques.optimizers import SPECS as OPTIMIZER_SPECS

SEQUENCE = 64
MICRO_BATCH = 2
# The Hugging Face decoder folders of HF_DECODERS train on longer sequences: 2 x 128 tokens.
DECODER_SEQUENCE = 128


class EncoderClassifier(nn.Module):
    """BERT-style encoder (hidden 64, 2 layers) with a classification head."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel

        self.encoder = BertModel(BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, intermediate_size=128,
                                            max_position_embeddings=SEQUENCE),
                                 add_pooling_layer=False)
        self.head = nn.Linear(64, 4)

    def forward(self, input_ids: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids).last_hidden_state  # [batch, seq, 64]
        return F.cross_entropy(self.head(hidden[:, 0]), classes.view(-1))


class ConvAutoencoder(nn.Module):
    """Conv encoder / transposed-conv decoder on 1 x 32 x 32 images."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            nn.Conv2d(1, 16, 3, stride=2, padding=1), nn.ReLU(),        # 16 x 16 x 16
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),       # 32 x 8 x 8
            nn.ConvTranspose2d(32, 16, 4, stride=2, padding=1), nn.ReLU(),  # 16 x 16 x 16
            nn.ConvTranspose2d(16, 1, 4, stride=2, padding=1),          # 1 x 32 x 32
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.blocks(images), images)


def encoder_classifier() -> nn.Module:
    return EncoderClassifier()


def conv_autoencoder() -> nn.Module:
    return ConvAutoencoder()


def write_data(folder: Path) -> dict[str, Path]:
    """A text corpus (causal LMs) and tensor files (the two factory models)."""
    rng = np.random.default_rng(0)
    text = folder / "corpus.txt"
    text.write_text("\n".join(f"line {i}: the quick brown fox jumps over the lazy dog"
                              for i in range(200)))
    held_out = folder / "held-out.txt"  # whole runs evaluate on it (a text file is one row)
    held_out.write_text("\n".join(f"line {i}: a lazy dog sleeps under the quick brown fox"
                                   for i in range(20)))
    tokens = folder / "tokens.npz"
    np.savez(tokens, input_ids=rng.integers(3, 300, (32, SEQUENCE)),
             classes=rng.integers(0, 4, (32, 1)))  # [rows, 1]: one label per example
    images = folder / "images.npz"
    np.savez(images, images=rng.normal(size=(32, 1, 32, 32)).astype(np.float32))
    return {"text": text, "held_out": held_out, "tokens": tokens, "images": images}


def tiny_gpt2_folder(folder: Path) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    from memfit.models.tokenizers import BYTE_VOCAB_SIZE, byte_level_tokenizer

    path = folder / "gpt2-tiny"
    if not path.exists():
        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config(vocab_size=BYTE_VOCAB_SIZE, n_positions=128, n_embd=64,
                                   n_layer=2, n_head=4)).save_pretrained(path)
        byte_level_tokenizer().save_pretrained(path)  # a folder without one gets a broken one
    return path


def tiny_llama_folder(folder: Path, layers: int) -> Path:
    """The tiny-llama preset (hidden 64) with ``layers`` decoder layers, random weights, saved
    as a Hugging Face folder (planned from its config.json: deeper than 4 layers, through
    2- and 3-layer stand-ins)."""
    from transformers import LlamaForCausalLM

    from memfit.models.presets import tiny_llama
    from memfit.models.tokenizers import byte_level_tokenizer

    path = folder / f"tiny-llama-{layers}"
    if not path.exists():
        torch.manual_seed(0)
        shape = tiny_llama()
        shape.num_hidden_layers = layers
        LlamaForCausalLM(shape).save_pretrained(path)
        byte_level_tokenizer().save_pretrained(path)
    return path


def wide_llama_folder(folder: Path) -> Path:
    """A Llama (hidden 256, MLP 1024, 2 layers) saved as an fp32 Hugging Face folder: QLoRA
    quantizes it while loading, so bitsandbytes dequantizes to fp32 in backward, and at 2 x
    64 tokens its MLP weights (1024 x 256) weigh as much as the activations around them."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from memfit.models.tokenizers import BYTE_VOCAB_SIZE, byte_level_tokenizer

    path = folder / "llama-wide"
    if not path.exists():
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(vocab_size=BYTE_VOCAB_SIZE, hidden_size=256,
                                     intermediate_size=1024, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     max_position_embeddings=128)).save_pretrained(path)
        byte_level_tokenizer().save_pretrained(path)
    return path


def hf_decoder_folder(folder: Path, kind: str) -> Path:
    """A small OPT, GPT-NeoX, Qwen2 or Phi-3 (hidden 128, MLP 512, 2 layers, 4 heads) with random
    weights, saved as an fp32 Hugging Face folder: the architectures beside Llama whose
    layers differ where adapters and a quantized base sit (biases on every projection and
    learned positions in OPT, a fused q/k/v projection and parallel residual in GPT-NeoX,
    q/k/v biases in Qwen2, fused q/k/v and gate/up in Phi-3). OPT is measured in whole runs
    only (WHOLE_RUN_MODELS)."""
    import transformers

    from memfit.models.tokenizers import BYTE_VOCAB_SIZE, byte_level_tokenizer

    path = folder / kind
    if not path.exists():
        torch.manual_seed(0)
        shape = {"vocab_size": BYTE_VOCAB_SIZE, "hidden_size": 128, "intermediate_size": 512,
                 "num_hidden_layers": 2, "num_attention_heads": 4,
                 "max_position_embeddings": 2 * DECODER_SEQUENCE}
        if kind == "gpt-neox":
            model = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**shape))
        elif kind == "opt":  # its MLP width is ffn_dim; learned positions, biases everywhere
            shape["ffn_dim"] = shape.pop("intermediate_size")
            model = transformers.OPTForCausalLM(transformers.OPTConfig(**shape))
        elif kind == "qwen2":
            model = transformers.Qwen2ForCausalLM(
                transformers.Qwen2Config(num_key_value_heads=2, **shape))
        else:  # Phi-3's default pad_token_id (32000) is outside this vocabulary
            model = transformers.Phi3ForCausalLM(
                transformers.Phi3Config(num_key_value_heads=2, pad_token_id=0, **shape))
        model.save_pretrained(path)
        byte_level_tokenizer().save_pretrained(path)
    return path


HF_DECODERS = ("gpt-neox", "qwen2", "phi3")


def architectures(data: dict[str, Path], folder: Path) -> dict[str, tuple[dict, dict | None]]:
    """name -> (config mapping, example micro-batch for the planner or None)."""
    text = {"data": {"path": str(data["text"]), "format": "text", "max_length": SEQUENCE,
                     "eval_fraction": 0.0}}
    tensors = {"format": "tensors", "eval_fraction": 0.0}
    long_text = {"data": {**text["data"], "max_length": DECODER_SEQUENCE}}
    return {
        "llama": ({"model": {"preset": "tiny-llama"}, **text}, None),
        "gpt2": ({"model": {"path": str(tiny_gpt2_folder(folder))}, **text}, None),
        "llama-wide": ({"model": {"path": str(wide_llama_folder(folder))}, **text}, None),
        "bert-encoder": (
            {"model": {"factory": "accuracy_cases:encoder_classifier", "task": "custom"},
             "data": {"path": str(data["tokens"]), **tensors}},
            {"input_ids": torch.zeros(MICRO_BATCH, SEQUENCE, dtype=torch.long),
             "classes": torch.zeros(MICRO_BATCH, 1, dtype=torch.long)}),
        "conv-autoencoder": (
            {"model": {"factory": "accuracy_cases:conv_autoencoder", "task": "custom"},
             "data": {"path": str(data["images"]), **tensors}},
            {"images": torch.zeros(MICRO_BATCH, 1, 32, 32)}),
        **{kind: ({"model": {"path": str(hf_decoder_folder(folder, kind))}, **long_text}, None)
           for kind in HF_DECODERS},
    }


PROJECTORS = tuple(projector.value for projector in GaloreProjector)


def _galore(projector: str = "randomized_svd", modules: list[str] | None = None,
            layerwise: bool = False, accumulate: int = 1, **galore) -> dict:
    """GaLore at rank 16 (below the 64-wide matrices of the small models: really projected)."""
    return {"optimizer": {"name": "galore", "layerwise": layerwise,
                          "galore": {"rank": 16, "projector": projector, "modules": modules or [],
                                     **galore}},
            "train": {"gradient_accumulation_steps": accumulate}}


# strategy name -> overrides on top of an architecture.
# The techniques whose spec brings its own case, by a one-word name ("frozen-embeddings")
# that the recorded table in docs/planner.md can show in its strategy column.
TECHNIQUE_CASES = {spec.name.replace(" ", "-"): spec for spec in registry.TECHNIQUES
                   if spec.plan_case}
STRATEGIES: dict[str, dict] = {
    "adamw": {"optimizer": {"name": "adamw"}},
    "adamw-bf16": {"optimizer": {"name": "adamw"}, "precision": "bf16"},
    "adamw8bit": {"optimizer": {"name": "adamw8bit"}},
    "adafactor": {"optimizer": {"name": "adafactor"}},
    # Every other registered optimizer with its defaults (paged_adamw8bit: CUDA only), so
    # a new one is planned against the measurement without editing this file.
    **{name: {"optimizer": {"name": name}} for name in OPTIMIZER_SPECS
       if name not in ("adamw", "adamw8bit", "adafactor", "galore", "paged_adamw8bit")},
    "adamw-accumulate": {"optimizer": {"name": "adamw"},
                         "train": {"gradient_accumulation_steps": 2}},
    "lora": {"adapter": {"kind": "lora", "rank": 4}},
    "lora-checkpointing": {"adapter": {"kind": "lora", "rank": 4},
                           "memory": {"gradient_checkpointing": True}},
    # A bitsandbytes base computes in bf16 and returns its output in its input's dtype.
    "qlora": {"adapter": {"kind": "qlora", "rank": 4}, "precision": "bf16"},
    "qlora-int8": {"adapter": {"kind": "qlora", "rank": 4, "quantization": "int8"},
                   "precision": "bf16"},
    "qlora-checkpointing": {"adapter": {"kind": "qlora", "rank": 4}, "precision": "bf16",
                            "memory": {"gradient_checkpointing": True}},
    **{f"galore-{projector}": _galore(projector=projector) for projector in PROJECTORS},
    # Only the MLP matrices projected; attention gets the plain inner update.
    "galore-mlp-only": _galore(modules=["mlp"]),
    "galore-layerwise": _galore(layerwise=True, accumulate=2),
    # On refresh steps every parameter accumulates its full gradient; update_gap 2 makes the
    # third step one, with the optimizer state of the first two alive.
    "galore-layerwise-full-gradient": _galore(layerwise=True, accumulate=2, update_gap=2,
                                              layerwise_refresh="full_gradient"),
    "adamw-layerwise": {"optimizer": {"name": "adamw", "layerwise": True},
                        "train": {"gradient_accumulation_steps": 2}},
    # Rank 8 on every linear layer but the output, the fp32 folder as it is (lora) or
    # quantized while loading (NF4 or int8) with bitsandbytes computing in bf16 or fp32.
    **{name: {"adapter": {"kind": kind, "rank": 8, "targets": ["all-linear"],
                          **({"quantization": "int8"} if name.endswith("int8") else {})},
              **extra}
       for name, kind, extra in (
           ("lora-r8", "lora", {}),
           ("lora-r8-checkpointing", "lora", {"memory": {"gradient_checkpointing": True}}),
           ("qlora-r8", "qlora", {"precision": "bf16"}),
           ("qlora-r8-fp32", "qlora", {}),
           ("qlora-r8-int8", "qlora", {"precision": "bf16"}),
           ("qlora-r8-checkpointing", "qlora", {"precision": "bf16",
                                                "memory": {"gradient_checkpointing": True}}))},
    "adamw-optimizer-offload": {"optimizer": {"name": "adamw"},
                                "memory": {"optimizer_offload": True}},
    # Measured on CPU too: the copies go to host-tagged storage the tracker counts apart.
    "adamw-activation-offload": {"optimizer": {"name": "adamw"},
                                 "memory": {"activation_offload": True}},
    # With checkpointing, what is offloaded are the checkpointed blocks' inputs.
    "lora-checkpointing-activation-offload": {
        "adapter": {"kind": "lora", "rank": 4},
        "memory": {"gradient_checkpointing": True, "activation_offload": True}},
    "chunked-loss": {"optimizer": {"name": "adamw"},
                     "memory": {"chunked_loss": True, "loss_chunk_tokens": 32}},
    # 2 x 64 tokens through each MLP in chunks of 32.
    "tiled-mlp": {"optimizer": {"name": "adamw"},
                  "memory": {"tiled_mlp": True, "mlp_chunk_tokens": 32}},
    "bf16-pure": {"optimizer": {"name": "adamw"}, "precision": "bf16-pure"},
    # Every technique whose spec brings its own case (a new one included).
    **{slug: dict(spec.plan_case) for slug, spec in TECHNIQUE_CASES.items()},
}


# What each architecture cannot run: memfit's LoRA targets nn.Linear / nn.Conv (GPT-2 uses
# transformers' Conv1D); the autoencoder has no repeated blocks to checkpoint, and no
# nn.Linear for bitsandbytes to quantize.
SKIP = {("gpt2", "lora"), ("gpt2", "lora-checkpointing"), ("gpt2", "qlora"),
        ("gpt2", "lora-checkpointing-activation-offload"),
        ("gpt2", "qlora-int8"), ("gpt2", "qlora-checkpointing"),
        ("conv-autoencoder", "lora-checkpointing"), ("conv-autoencoder", "qlora"),
        ("conv-autoencoder", "qlora-int8"), ("conv-autoencoder", "qlora-checkpointing")}
# The GaLore family and the layer-wise, offload and chunked-loss cases run on the causal LMs
# (GPT-2's Conv1D layers are GaLore targets too; chunked loss needs a causal LM).
LANGUAGE_MODELS_ONLY = ("galore", "adamw-layerwise", "adamw-optimizer-offload", "chunked-loss",
                        "adamw-activation-offload", "lora-checkpointing-activation-offload")
# Architectures that are only there for their quantized base and for the GaLore family,
# whose optimizer step (SVDs of 256 x 1024 matrices, full-size APOLLO updates) is the peak.
WIDE_ONLY = {"llama-wide": ("qlora", "galore"),
             # The decoder folders are there for their adapters, and only they run the
             # rank-8 strategies.
             **{kind: ("lora-r8", "qlora-r8") for kind in HF_DECODERS}}
RANK_8 = ("lora-r8", "qlora-r8")
# Techniques measured on the tiny Llama alone: the tiled MLP tiles Llama-style MLP modules,
# and one architecture shows what casting every weight to bf16 does.
LLAMA_ONLY = ("tiled-mlp", "bf16-pure",
              *TECHNIQUE_CASES)
ADAPTER_TARGETS = {"conv-autoencoder": ["conv"]}


def cases(data: dict[str, Path], folder: Path):
    """(architecture, strategy, Config, example batch) for every valid pair."""
    for arch, (base, example) in architectures(data, folder).items():
        for name, overrides in STRATEGIES.items():
            if (arch, name) in SKIP or (arch in WIDE_ONLY and not name.startswith(WIDE_ONLY[arch])):
                continue
            if name.startswith(RANK_8) and arch not in HF_DECODERS:
                continue
            if name in LLAMA_ONLY and arch != "llama":
                continue
            if name.startswith(LANGUAGE_MODELS_ONLY) and arch not in ("llama", "gpt2", *WIDE_ONLY):
                continue
            if "adapter" in overrides and arch in ADAPTER_TARGETS:
                overrides = {**overrides, "adapter": {**overrides["adapter"],
                                                      "targets": ADAPTER_TARGETS[arch]}}
            yield arch, name, config_for(base, overrides), example


def config_for(base: dict, overrides: dict) -> Config:
    from memfit.config.load import merge

    common = {"train": {"micro_batch_size": MICRO_BATCH, "max_steps": 3, "max_grad_norm": 1.0},
              "log": {"tensorboard": False, "progress": False}}
    return from_mapping(merge(merge(common, base), overrides))


def measure_peak_bytes(config: Config, steps: int = 3) -> int:
    """Peak live tensor bytes of real training steps on CPU (the memory meter's view), each
    the training loop's own step."""
    return measure_peak(config, steps)[0].peak_bytes


def measure_peak(config: Config, steps: int = 3):
    """(the memory meter's StepMemory of the highest-peak step, bytes by category; the host
    pool's peak over the steps: what offload moved there), over ``steps`` real training
    steps on CPU."""
    measured = measure_steps(config, steps)
    return measured.peak, measured.host_peak_bytes


@dataclass(frozen=True)
class Measured:
    peak: Any  # monitor.memory.StepMemory of the highest-peak step
    host_peak_bytes: int  # the host pool's peak over the steps: what offload moved there
    losses: list[float]  # each step's loss


def measure_steps(config: Config, steps: int = 3) -> Measured:
    """``steps`` real training steps on CPU, each the training loop's own step, under the
    memory meter."""
    from memfit.monitor.memory import CpuMemoryMeter
    from memfit.training.batches import BatchStream
    from memfit.training.build import build_run
    from memfit.training.step import optimizer_step, step_parts

    run = build_run(config)
    run.model.train()  # as the loop does: from_pretrained returns a model in eval mode
    meter = CpuMemoryMeter()
    meter.attach(run.model, run.optimizer)
    train = config.train
    stream = BatchStream(run.splits.train, train.micro_batch_size, train.seed, run.collate)
    parts = step_parts(run)
    host_peak, losses = 0, []
    for _ in range(steps):
        batches = [stream.next_batch() for _ in range(train.gradient_accumulation_steps)]
        items = sum(run.objective.count(batch) for batch in batches)
        with meter.step():
            losses.append(optimizer_step(parts, batches, items).loss)
        host_peak = max(host_peak, meter.last_step.host_peak_bytes)
    return Measured(meter.peak, host_peak, losses)


# ---- whole runs (whole_run.measure_whole_run) -------------------------------------------
def llama_69m_folder(folder: Path) -> Path:
    """benchmarks/memory_techniques.py's 69M Llama (hidden 768, 8 layers, untied head, vocab
    8,000) with random weights, an fp32 folder with the byte-level tokenizer: deeper than the
    planner traces exactly, so its plan is extrapolated from 2 and 3 layers, and large enough
    that its weights, not the activations of 2 x 128 tokens, set most of the peak."""
    from memfit.bench.random_llama import LLAMA_69M, llama_config, save_random_model
    from memfit.models.tokenizers import byte_level_tokenizer

    path = folder / "llama-69m"
    if not path.exists():
        save_random_model(path, llama_config(LLAMA_69M), byte_level_tokenizer())
    return path


# OPT-style models and a 69M Llama besides the suite's decoders, each as an fp32 folder.
WHOLE_RUN_MODELS = ("opt", *HF_DECODERS, "llama-69m")
# Full fine-tuning, LoRA with checkpointing and QLoRA, rank 8 on every linear layer.
WHOLE_RUN_STRATEGIES = ("adamw", "lora-r8-checkpointing", "qlora-r8")
WHOLE_RUN_STEPS = 2


def whole_run_config(data: dict[str, Path], folder: Path, model: str, strategy: str) -> Config:
    """A whole run's config: 2 x 128 tokens, WHOLE_RUN_STEPS steps, an evaluation of one
    held-out micro-batch at the end, and the final checkpoint and export."""
    path = llama_69m_folder(folder) if model == "llama-69m" else hf_decoder_folder(folder, model)
    base = {"model": {"path": str(path)},
            "data": {"path": str(data["text"]), "format": "text",
                     "max_length": DECODER_SEQUENCE, "eval_path": str(data["held_out"])},
            "train": {"max_steps": WHOLE_RUN_STEPS, "eval_max_batches": 1}}
    return config_for(base, STRATEGIES[strategy])


def whole_run_cases(data: dict[str, Path], folder: Path,
                    models: tuple[str, ...] = WHOLE_RUN_MODELS):
    """(model, strategy, Config) of every whole-run case."""
    for model in models:
        for strategy in WHOLE_RUN_STRATEGIES:
            yield model, strategy, whole_run_config(data, folder, model, strategy)
