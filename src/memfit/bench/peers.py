"""The peers: how people fine-tune today, each written the way its documentation shows,
run on the same model folder, batches and seed as memfit and measured by memfit's meter.

A peer reads its numbers (learning rate, betas, precision, LoRA rank, GaLore rank ...)
from the memfit ``Config`` of the case it mirrors, so a pair differs only in the tool.
Each returns the records ``memfit.train`` writes to metrics.jsonl: ``step``, ``loss``,
``tokens``, ``step_seconds`` and, on measured steps, the meter's memory keys.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memfit.config.schema import Config, Precision
from memfit.data import count_loss_tokens
from memfit.monitor.memory import MemoryMeter, make_memory_meter
from memfit.training.step import StepParts, optimizer_step

Batch = dict[str, torch.Tensor]
Record = dict[str, Any]
# GaLore projects the attention and MLP matrices (the GaLore README's target modules).
GALORE_TARGETS = ("attn", "mlp")


def _load(folder: Path, device: torch.device) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).to(device)


def _is_measured(step: int, config: Config) -> bool:
    # The steps memfit.train measures with log.memory_every=k (see runner.memory_every).
    return step % config.log.memory_every == 0


def _model_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(**batch).loss  # transformers' mean over the batch's tokens


def _plain_loop(model: nn.Module, optimizer: torch.optim.Optimizer | None, batches: list[Batch],
                config: Config, device: torch.device) -> list[Record]:
    """The loop a user writes: forward under autocast, backward of ``.loss`` (a mean), step,
    zero; one micro-batch a step, no clipping, no loss scaling. ``optimizer`` None: per-layer
    optimizers stepped in backward."""
    meter = make_memory_meter(device)
    meter.attach(model, optimizer)
    model.train()
    parts = StepParts(model, optimizer, _model_loss, config.precision, device)
    records = []
    for step, batch in enumerate(batches, start=1):
        measured = _is_measured(step, config)
        started = time.perf_counter()
        with meter.step() if measured else contextlib.nullcontext():
            loss = optimizer_step(parts, [batch], items=None).loss
        records.append(_record(step, loss, batch, time.perf_counter() - started,
                               meter if measured else None))
    return records


def _record(step: int, loss: float, batch: Batch, seconds: float,
            meter: MemoryMeter | None) -> Record:
    record = {"step": step, "loss": loss, "tokens": count_loss_tokens(batch),
              "step_seconds": seconds}
    if meter is not None and meter.last_step is not None:
        record.update(meter.last_step.to_record())
    return record


def _adam_arguments(config: Config) -> dict[str, Any]:
    optimizer = config.optimizer
    # weight_decay given explicitly: torch's and bitsandbytes' defaults are 0.01, memfit's 0.
    return {"lr": optimizer.lr, "betas": optimizer.betas, "eps": optimizer.eps,
            "weight_decay": optimizer.weight_decay}


def torch_adamw(folder: Path, config: Config, batches: list[Batch],
                device: torch.device) -> list[Record]:
    model = _load(folder, device)
    optimizer = torch.optim.AdamW(model.parameters(), **_adam_arguments(config))
    return _plain_loop(model, optimizer, batches, config, device)


def bnb_adamw8bit(folder: Path, config: Config, batches: list[Batch],
                  device: torch.device) -> list[Record]:
    import bitsandbytes as bnb

    model = _load(folder, device)
    optimizer = bnb.optim.AdamW8bit(model.parameters(), **_adam_arguments(config))
    return _plain_loop(model, optimizer, batches, config, device)


def torch_adafactor(folder: Path, config: Config, batches: list[Batch],
                    device: torch.device) -> list[Record]:
    model = _load(folder, device)
    optimizer = torch.optim.Adafactor(model.parameters(), lr=config.optimizer.lr)
    return _plain_loop(model, optimizer, batches, config, device)


def peft_lora(folder: Path, config: Config, batches: list[Batch],
              device: torch.device) -> list[Record]:
    """PEFT's recipe: (4-bit load + prepare_model_for_kbit_training for QLoRA),
    non-reentrant checkpointing when asked, get_peft_model, AdamW on what trains."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    adapter = config.adapter
    checkpointing = config.memory.gradient_checkpointing
    kwargs = {"use_reentrant": False}
    if adapter.kind.value == "qlora":
        compute = torch.bfloat16 if config.precision is Precision.BF16 else torch.float32
        quantization = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=adapter.double_quant, bnb_4bit_compute_dtype=compute)
        # bitsandbytes quantizes while loading: place the layers on the GPU from the start.
        placement = ({"device_map": {"": torch.cuda.current_device()}}
                     if device.type == "cuda" else {})
        model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=quantization,
                                                     **placement)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing,
                                                gradient_checkpointing_kwargs=kwargs)
    else:
        model = _load(folder, device)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model = get_peft_model(model, LoraConfig(r=adapter.rank, lora_alpha=adapter.alpha,
                                             lora_dropout=adapter.dropout,
                                             target_modules="all-linear"))
    model.to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, **_adam_arguments(config))
    return _plain_loop(model, optimizer, batches, config, device)


def _galore_groups(model: nn.Module, config: Config) -> tuple[list, list]:
    """(other parameters, projected linear weights) as the GaLore README selects them."""
    projected = [module.weight for name, module in model.named_modules()
                 if isinstance(module, nn.Linear) and any(t in name for t in GALORE_TARGETS)]
    ids = {id(p) for p in projected}
    return [p for p in model.parameters() if id(p) not in ids], projected


def _galore_settings(config: Config) -> dict[str, Any]:
    galore = config.optimizer.galore
    return {"rank": galore.rank, "update_proj_gap": galore.update_gap, "scale": galore.scale,
            "proj_type": "std"}


def galore_torch(folder: Path, config: Config, batches: list[Batch],
                 device: torch.device) -> list[Record]:
    from galore_torch import GaLoreAdamW

    model = _load(folder, device)
    other, projected = _galore_groups(model, config)
    optimizer = GaLoreAdamW([{"params": other},
                             {"params": projected, **_galore_settings(config)}],
                            **_adam_arguments(config))
    return _plain_loop(model, optimizer, batches, config, device)


def galore_torch_layerwise(folder: Path, config: Config, batches: list[Batch],
                           device: torch.device) -> list[Record]:
    """The GaLore README's per-layer recipe: one GaLoreAdamW per parameter, stepped by a
    post-accumulate-grad hook (so it steps on every backward; fine without accumulation)."""
    from galore_torch import GaLoreAdamW

    model = _load(folder, device)
    other, projected = _galore_groups(model, config)
    arguments = _adam_arguments(config)
    per_parameter = {p: GaLoreAdamW([{"params": [p]}], **arguments) for p in other}
    per_parameter.update({p: GaLoreAdamW([{"params": [p], **_galore_settings(config)}],
                                         **arguments) for p in projected})

    def step_parameter(parameter: torch.Tensor) -> None:
        per_parameter[parameter].step()
        per_parameter[parameter].zero_grad(set_to_none=True)

    for parameter in per_parameter:
        parameter.register_post_accumulate_grad_hook(step_parameter)
    return _plain_loop(model, None, batches, config, device)


def hf_trainer_galore(folder: Path, config: Config, batches: list[Batch],
                      device: torch.device) -> list[Record]:
    """``transformers.Trainer`` with ``optim="galore_adamw_layerwise"``, fed the same
    pre-collated batches in order; a callback wraps each step in the meter."""
    from torch.utils.data import SequentialSampler
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class InOrderTrainer(Trainer):
        def _get_train_sampler(self, train_dataset=None) -> SequentialSampler:
            return SequentialSampler(self.train_dataset)

    meter = make_memory_meter(device)
    records: dict[int, Record] = {}

    class Measure(TrainerCallback):
        def __init__(self) -> None:
            self.measuring = contextlib.ExitStack()
            self.started = 0.0

        def on_train_begin(self, args, state, control, model=None, optimizer=None, **_):
            meter.attach(model, optimizer)

        def on_step_begin(self, args, state, control, **_):
            step = state.global_step + 1
            if _is_measured(step, config):
                self.measuring.enter_context(meter.step())
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **_):
            self.measuring.close()  # leaves meter.step() if this step entered it
            step = state.global_step
            records[step] = _record(step, float("nan"), batches[step - 1],
                                    time.perf_counter() - self.started,
                                    meter if _is_measured(step, config) else None)

        def on_log(self, args, state, control, logs=None, **_):
            if logs and "loss" in logs and state.global_step in records:
                records[state.global_step]["loss"] = float(logs["loss"])

    galore = _galore_settings(config)
    arguments = TrainingArguments(
        output_dir=str(Path(config.train.output_dir) / "trainer"), max_steps=len(batches),
        per_device_train_batch_size=1, learning_rate=config.optimizer.lr,
        adam_beta1=config.optimizer.betas[0], adam_beta2=config.optimizer.betas[1],
        adam_epsilon=config.optimizer.eps, weight_decay=config.optimizer.weight_decay,
        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=0.0,
        optim="galore_adamw_layerwise", optim_target_modules=list(GALORE_TARGETS),
        optim_args=", ".join(f"{key}={value}" for key, value in galore.items()
                             if key != "proj_type"),
        bf16=config.precision is Precision.BF16, use_cpu=device.type == "cpu",
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        seed=config.train.seed, remove_unused_columns=False, dataloader_num_workers=0)
    trainer = InOrderTrainer(model=_load(folder, device), args=arguments,
                             train_dataset=batches, data_collator=_first,
                             callbacks=[Measure()])
    trainer.train()
    return [records[step] for step in sorted(records)]


def _first(items: list[Batch]) -> Batch:
    # Each dataset item is already a collated micro-batch (per_device_train_batch_size=1).
    return items[0]


PEERS: dict[str, Callable[[Path, Config, list[Batch], torch.device], list[Record]]] = {
    "torch-adamw": torch_adamw,
    "bnb-adamw8bit": bnb_adamw8bit,
    "torch-adafactor": torch_adafactor,
    "peft": peft_lora,
    "galore-torch": galore_torch,
    "galore-torch-layerwise": galore_torch_layerwise,
    "hf-trainer-galore": hf_trainer_galore,
}


def batches_like_memfit(config: Config, tokenizer: Any) -> Iterator[Batch]:
    """The micro-batches ``memfit.train`` draws for ``config``, in its order."""
    from memfit.data import build_datasets, collate
    from memfit.training.batches import BatchStream

    splits = build_datasets(config.data, tokenizer, seed=config.train.seed)
    pad = tokenizer.pad_token_id
    stream = BatchStream(splits.train, config.train.micro_batch_size, config.train.seed,
                         lambda examples: collate(examples, pad_token_id=pad))
    while True:
        yield stream.next_batch()
