"""The typed configuration: frozen dataclasses whose field docs become `--help` and the
config reference (docs/config.md). Every shared key lives here, once; the keys one
optimizer or one memory technique declares for itself live in its spec, and the section
keeps them in its ``own`` field (config/fields.py: own_keys).

Sections mirror the YAML file: ``model`` (with ``model.rope_scaling``, in rope.py), ``data``
(with ``data.images``, in images.py), ``adapter``, ``optimizer`` (with ``optimizer.galore``),
``precision``, ``memory``, ``train``, ``distributed``, ``log``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memfit.config.choices import (
    AdapterKind,
    BaseQuantization,
    DataFormat,
    DistributedStrategy,
    GaloreInner,
    GaloreProjector,
    LayerwiseRefresh,
    LrSchedule,
    ModelDtype,
    NonfiniteAction,
    OomRung,
    Precision,
    ReconstructionLoss,
    SubspaceChange,
    Task,
)
from memfit.config.fields import doc, own_keys
from memfit.config.images import ImagesConfig
from memfit.config.limits import (
    MAX_BATCH,
    MAX_CLASSES,
    MAX_DEVICES,
    MAX_RANK,
    MAX_SEED,
    MAX_STEPS,
    MAX_TOKENS,
)
from memfit.config.rope import RopeScalingConfig


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = doc(
        "Local Hugging Face model folder (config.json + weights); the Auto class is chosen "
        "by model.task. Or a .gguf file (or a folder holding one and no weights): a causal "
        "LM, dequantized into model.dtype. One of model.path / model.preset / "
        "model.factory.",
        default=None,
    )
    preset: str | None = doc(
        "Built-in model built from a config with random weights (e.g. tiny-llama), or the "
        "shipped pretrained demo base 'demo-base'. See `memfit env` for the list.",
        default=None,
    )
    factory: str | None = doc(
        "'package.module:function' or 'path/to/file.py:function' returning an nn.Module. "
        "The module's forward(**batch) returns a loss tensor (or an object with .loss) unless "
        "model.loss is set; with model.task=autoencoder, forward(images) returns the "
        "reconstruction; with image-classification, forward(images) returns (batch, classes) "
        "logits (top-level parts named classifier or score train in full beside adapters).",
        default=None,
    )
    loss: str | None = doc(
        "'package.module:function' called as loss(outputs, batch) -> scalar mean loss, for "
        "factory models whose forward does not return a loss.",
        default=None,
    )
    export_module: str | None = doc(
        "Factory models wrapping a Hugging Face model: the dotted name of that inner "
        "transformers PreTrainedModel (e.g. model, for self.model = AutoModel...). The "
        "export (model/) and memfit merge then write it as a normal Hugging Face folder, and "
        "adapter/ names its modules relative to it, so PeftModel.from_pretrained loads it "
        "onto the plain model. Everything that trains must lie inside it. null: the whole "
        "module, as a safetensors state dict.",
        default=None,
    )
    task: Task = doc("What the model is trained to do.", default=Task.CAUSAL_LM)
    num_labels: int | None = doc(
        "model.task=sequence-classification or image-classification: how many classes the "
        "new head predicts. "
        "null: as many as the training data's labels need (see model.labels); a larger "
        "number leaves room for classes the data does not have yet.",
        limits=(2, MAX_CLASSES), default=None,
    )
    labels: tuple[str, ...] = doc(
        "model.task=sequence-classification or image-classification: the class names in id "
        "order (the exported config's id2label). Empty: found in the training data (class "
        "folder names and string labels sorted, "
        "integer labels as their own ids 0..max). A run's config.yaml records the labels "
        "it trained with, so memfit merge and --resume rebuild the same head.",
        default=(),
    )
    dtype: ModelDtype = doc(
        "Dtype the weights are loaded in (precision=bf16-pure casts them to bfloat16).",
        default=ModelDtype.FLOAT32,
    )
    reconstruction_loss: ReconstructionLoss = doc(
        "model.task=autoencoder: mse or l1 between the reconstruction and the target image.",
        default=ReconstructionLoss.MSE,
    )
    rope_scaling: RopeScalingConfig = doc("Rotary positions past the native window.",
                                          default_factory=RopeScalingConfig)


@dataclass(frozen=True)
class DataConfig:
    path: str | None = doc(
        "Training data: a .jsonl/.json/.csv/.parquet/.txt/.npz/.pt file, a "
        "datasets.save_to_disk folder, or (format=images) an image/array file or folder; "
        "model.task=image-classification: a folder of class folders (train/<class>/*.png) "
        "or a .npz with 'images' and 'labels' (class ids or names). "
        "Relative paths in a YAML file are resolved against that file's folder.",
        default=None,
    )
    format: DataFormat = doc(
        "How rows become examples: text (a 'text' field, packed), instruction "
        "(prompt/response or instruction/input/output; prompt masked out of the loss), chat "
        "('messages'; only assistant turns in the loss), classification (a text field and a "
        "label field, for model.task=sequence-classification), tensors (named arrays), "
        "images (a folder or file of PNG/JPEG images, each file one image, or .npy/.npz "
        "arrays: one image (H, W[, C]) or a stack (N, H, W), (N, H, W, C), (N, C, H, W); see "
        "data.images).",
        default=DataFormat.TEXT,
    )
    max_length: int = doc("Tokens per example (truncation) or per packed block.",
                          limits=(1, MAX_TOKENS), default=256)
    eval_fraction: float = doc(
        "Fraction of rows held out for evaluation, chosen by a seeded shuffle; 0 disables "
        "evaluation. Not used when data.eval_path is set.",
        default=0.1,
    )
    eval_path: str | None = doc(
        "A separate evaluation file or folder, in data.format like data.path; when set, "
        "all of data.path trains and data.eval_fraction is not used (setting both is warned).",
        default=None,
    )
    pack: bool | None = doc(
        "Pack rows into max_length blocks. format=text: documents joined and cut into "
        "blocks (each attends to the documents before it in its block). format=instruction "
        "or chat: whole rows placed greedily (first fit, in order) into blocks of up to "
        "max_length tokens, each row attending only to itself (position ids restart per "
        "row; needs a transformers model). Unset: true for text, false for instruction and "
        "chat (rows padded to the longest in each micro-batch).",
        default=None,
    )
    text_field: str = doc("format=text or classification: the field holding the text.",
                          default="text")
    label_field: str = doc(
        "format=classification: the field holding each row's label, an integer (the class "
        "id) or a string (the class name).",
        default="label",
    )
    images: ImagesConfig = doc("format=images: size, channels and contrast.",
                               default_factory=ImagesConfig)
    sample_prompts: tuple[str, ...] = doc(
        "model.task=causal-lm: prompts the model answers at each evaluation (greedy, laid "
        "out as data.format lays out a prompt), logged to metrics.jsonl (a record with step "
        "and sample_answers), TensorBoard (text) and memfit report.",
        default=(),
    )
    sample_max_new_tokens: int = doc("data.sample_prompts: tokens each answer has at most.",
                                     limits=(1, MAX_TOKENS), default=32)


@dataclass(frozen=True)
class AdapterConfig:
    kind: AdapterKind = doc(
        "none (train the weights themselves), lora, or qlora (LoRA on a 4-bit base).",
        default=AdapterKind.NONE,
    )
    rank: int = doc("LoRA rank r.", limits=(1, MAX_RANK), default=8)
    alpha: float = doc("LoRA scaling numerator: the update is (alpha / rank) B A.", default=16.0)
    dropout: float = doc("Dropout on the LoRA input.", default=0.0)
    targets: tuple[str, ...] = doc(
        "Which modules get adapters. Each entry is a kind (attention-qv, attention-q, "
        "attention-k, attention-v: on a fused q,k,v projection such as qkv, c_attn, qkv_proj "
        "or nn.MultiheadAttention only those parts' rows; attention, mlp, all-linear, conv), "
        "an encoder-decoder placement (encoder, encoder-late: the later "
        "half of the encoder's blocks, decoder), a module class name (Linear, Conv2d, "
        "MyAttention), or a module name / glob on full names (q_proj, "
        "'encoder.blocks.*.attn.qkv').",
        default=("all-linear",),
    )
    restrict_to: tuple[str, ...] = doc(
        "Only adapt modules inside these parts of the model: globs on module names, each "
        "covering everything below what it matches (e.g. 'decoder', 'encoder.blocks.[2-3]'). "
        "Empty: the whole model.",
        default=(),
    )
    rslora: bool = doc("Rank-stabilised LoRA: scale by alpha / sqrt(rank).", default=False)
    dora: bool = doc("DoRA: learn a per-output magnitude beside the LoRA direction.",
                     default=False)
    trainable_modules: tuple[str, ...] = doc(
        "Modules trained in full beside the adapters (e.g. a new head): names or globs.",
        default=(),
    )
    quantization: BaseQuantization = doc(
        "kind=qlora: the frozen base's format, nf4 (4-bit NormalFloat) or int8.",
        default=BaseQuantization.NF4,
    )
    double_quant: bool = doc(
        "kind=qlora with nf4: also quantize the per-block scales (4.127 instead of 4.5 bits "
        "per weight).",
        default=True,
    )
    frozen_in_compute_dtype: bool = doc(
        "With precision=bf16/fp16: store frozen Linear weights (not quantized ones) in that "
        "dtype. Autocast computes with exactly those values, so results do not change; their "
        "bytes halve.",
        default=True,
    )


@dataclass(frozen=True)
class GaloreConfig:
    rank: int = doc("Rank r of the projected gradient.", limits=(1, MAX_RANK), default=128)
    update_gap: int = doc("Optimizer steps between projector refreshes (T).",
                          limits=(1, MAX_STEPS), default=200)
    scale: float = doc("Scale applied to the projected-back update.", default=0.25)
    projector: GaloreProjector = doc(
        "svd, randomized_svd, online (Online Subspace Descent), random (APOLLO) or "
        "apollo_mini (APOLLO-Mini: rank 1, one scale per tensor; the paper uses "
        "optimizer.galore.scale=11.3, sqrt(128)).",
        default=GaloreProjector.RANDOMIZED_SVD,
    )
    inner: GaloreInner = doc(
        "Update applied to the projected gradient: adamw, adamw8bit or adafactor.",
        default=GaloreInner.ADAMW,
    )
    subspace_change: SubspaceChange = doc(
        "What the moments do when the projector changes: reproject (carry them into the new "
        "basis; measured best, see docs/optimizers.md), keep, or reset.",
        default=SubspaceChange.REPROJECT,
    )
    modules: tuple[str, ...] = doc(
        "Project only linear/conv layers whose name contains one of these (empty: every "
        "linear/conv layer except the output head).",
        default=(),
    )
    project_in_backward: bool = doc(
        "Linear layers hand GaLore R = P^T G computed from their input and output gradient "
        "in backward, on steps that keep P: the full weight gradient is never formed (fewer "
        "multiply-adds, no full-size grad). Applies with projector svd or randomized_svd, "
        "without memory.optimizer_offload or fp16; clipping then counts those weights by "
        "||P^T G||.",
        default=True,
    )
    layerwise_refresh: LayerwiseRefresh = doc(
        "With optimizer.layerwise and accumulation, where a new projector comes from: "
        "micro_batch (the first micro-batch's gradient; buffers stay r x n) or "
        "full_gradient (the whole step's gradient; full-size buffers on refresh steps, "
        "identical to the ordinary loop).",
        default=LayerwiseRefresh.MICRO_BATCH,
    )


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = doc(
        "Optimizer: one of memfit's (`memfit env` lists them, docs/optimizers.md says what "
        "each keeps), or the class path 'package.module:Class' (or 'file.py:Class') of any "
        "torch.optim.Optimizer, built as Class(groups, lr=optimizer.lr, **optimizer.kwargs).",
        default="adamw")
    kwargs: dict[str, Any] = doc(
        "Keyword arguments of a class-path optimizer.name (e.g. {momentum: 0.9}).",
        default_factory=dict)
    lr: float = doc("Peak learning rate.", default=2e-4)
    weight_decay: float = doc(
        "Decoupled weight decay; never applied to norms, biases or embeddings.", default=0.0
    )
    betas: tuple[float, float] | None = doc(
        "Moment coefficients (beta1, beta2) of the optimizers that keep moments. null: the "
        "named optimizer's own (docs/optimizers.md lists each one's).", default=None)
    eps: float | None = doc(
        "Denominator epsilon of the Adam-type optimizers. null: the named optimizer's own.",
        default=None)
    layerwise: bool = doc(
        "Step each parameter inside backward so at most one full gradient is alive "
        "(gradient accumulation still works).",
        default=False,
    )
    galore: GaloreConfig = doc("GaLore family settings (optimizer.name=galore).",
                               default_factory=GaloreConfig)
    own: dict[str, Any] = own_keys(
        "Keys one optimizer declares for itself in its spec (optimizer.momentum of sgd), "
        "written beside the keys above; each is listed below with its optimizer.")


@dataclass(frozen=True)
class MemoryConfig:
    gradient_checkpointing: bool = doc(
        "Recompute activations in backward instead of keeping them.", default=False
    )
    checkpoint_modules: tuple[str, ...] = doc(
        "model.factory models: blocks to checkpoint, as class names or globs on module "
        "names. Empty: the items of the model's largest nn.ModuleList / nn.Sequential.",
        default=(),
    )
    checkpoint_every: int = doc(
        "Checkpoint every k-th block only (1: all), trading memory back for speed.",
        limits=(1, 10**6), default=1
    )
    checkpoint_blocks: int | float | None = doc(
        "memory.gradient_checkpointing: which blocks to checkpoint, counted from the input "
        "side: a whole number N (the first N; 0: none) or a fraction in (0, 1] (that share "
        "of the blocks, rounded up; 1.0: all, while 1 is the first block only); null: all. "
        "memory.checkpoint_every applies within them: blocks 0, k, 2k, ... below N.",
        limits=(0, 10**6), default=None,
    )
    activation_offload: bool = doc("Keep saved activations in host memory.", default=False)
    offload_blocks: int | float | None = doc(
        "memory.activation_offload: which blocks' saved activations go to host memory, "
        "counted from the input side as memory.checkpoint_blocks counts them: of a "
        "checkpointed block its inputs, of any other block everything it saves. null: "
        "every saved tensor, inside the blocks and outside them (embeddings, head, loss); a "
        "number leaves everything outside the chosen blocks on the device.",
        limits=(0, 10**6), default=None,
    )
    optimizer_offload: bool = doc("Keep optimizer state in host memory.", default=False)
    chunked_loss: bool = doc(
        "Compute the LM loss in sequence chunks, never materialising full fp32 logits.",
        default=False,
    )
    tiled_mlp: bool = doc(
        "Compute each block's MLP (modules whose class name ends in MLP) over chunks of "
        "memory.mlp_chunk_tokens tokens, each chunk recomputed in backward, so its "
        "tokens x intermediate activations exist for one chunk at a time (long sequences).",
        default=False,
    )
    tiled_norms: bool = doc(
        "Compute each norm (modules whose class name ends in RMSNorm or LayerNorm) over "
        "chunks of memory.norm_chunk_tokens tokens, each chunk recomputed in backward, so a "
        "norm keeps only its input, not an fp32 copy of it, and its fp32 work exists for one "
        "chunk at a time (long sequences).",
        default=False,
    )
    own: dict[str, Any] = own_keys(
        "Keys one memory technique declares for itself in its spec (memory.loss_chunk_tokens, "
        "mlp_chunk_tokens, norm_chunk_tokens, freeze_blocks), written beside the keys above; "
        "each is listed below with its technique.")
    freeze_embeddings: bool = doc(
        "Full fine-tuning: freeze the input embedding and the output layer (tied or not), "
        "so they take no gradients and no optimizer state.", default=False)
    budget: int | str | None = doc(
        "Device memory budget, e.g. 24GiB, 512MiB, 16GB or a byte count. On CPU it is "
        "enforced by the tensor tracker (a simulated device).",
        default=None,
    )
    auto: bool = doc("Apply the planner's recommended strategy for memory.budget.",
                     default=False)
    auto_keep_adapters: bool = doc(
        "memory.auto (and memfit plan's recommendation): choose among the strategies that "
        "train adapters (lora, qlora) only, never a full fine-tune.",
        default=False,
    )
    recover_from_oom: bool = doc(
        "On out-of-memory in forward/backward, halve the micro-batch (doubling accumulation) "
        "or offload activations, and retry the same step.",
        default=True,
    )
    oom_rung: OomRung = doc("Which OOM rung: fastest (of those keeping the math and state, "
                            "the one planned to fit with the least step time) or in_order "
                            "(the ladder's order).", default=OomRung.FASTEST)


@dataclass(frozen=True)
class TrainConfig:
    micro_batch_size: int = doc("Examples per forward/backward pass.",
                                limits=(1, MAX_BATCH), default=4)
    gradient_accumulation_steps: int = doc(
        "Micro-batches per optimizer step; the loss is normalised over all tokens of the "
        "effective batch.",
        limits=(1, MAX_BATCH), default=1,
    )
    max_steps: int | None = doc(
        "Optimizer steps to run; when unset, train.epochs decides.",
        limits=(1, MAX_STEPS), default=None
    )
    epochs: float = doc("Passes over the training set when max_steps is unset.", default=1.0)
    lr_schedule: LrSchedule = doc("Learning-rate schedule after warmup.",
                                  default=LrSchedule.COSINE)
    warmup_steps: int = doc("Linear warmup steps from 0 to optimizer.lr.",
                            limits=(0, MAX_STEPS), default=0)
    max_grad_norm: float | None = doc(
        "Clip the global gradient norm to this value; unset disables clipping.", default=1.0
    )
    eval_every: int = doc("Evaluate every N optimizer steps (0: only at the end).",
                          limits=(0, MAX_STEPS), default=0)
    eval_max_batches: int | None = doc(
        "Evaluate on at most this many batches of train.micro_batch_size examples: the "
        "eval split's first ones, the same each time; unset: the whole eval split.",
        limits=(1, MAX_STEPS), default=None,
    )
    eval_at_start: bool = doc(
        "Evaluate before the first step too (step 0, the summary's eval loss before "
        "training); false: only every train.eval_every steps and at the end.",
        default=True,
    )
    save_every: int = doc("Save a checkpoint every N optimizer steps (0: only at the end).",
                          limits=(0, MAX_STEPS), default=0)
    keep_checkpoints: int = doc("How many of the newest checkpoints to keep.",
                                limits=(1, 10**6), default=2)
    on_nonfinite: NonfiniteAction = doc(
        "When a step's loss or gradient norm is nan or inf: stop (exit status 3, keeping the "
        "last finite checkpoint) or skip (drop that step's update and go on; with "
        "precision=fp16 only the loss counts, the gradient scaler handles inf gradients).",
        default=NonfiniteAction.STOP,
    )
    max_consecutive_skips: int = doc(
        "train.on_nonfinite=skip: steps in a row that may be skipped; one more non-finite "
        "step stops the run.",
        limits=(1, MAX_STEPS), default=5,
    )
    seed: int = doc("Seed for weights, data order and dropout.", limits=(0, MAX_SEED), default=0)
    output_dir: str | None = doc(
        "Run folder; default runs/<date>-<time> under the current directory.", default=None
    )


@dataclass(frozen=True)
class DistributedConfig:
    strategy: DistributedStrategy = doc(
        "none, ddp (DistributedDataParallel: every process holds the whole model) or fsdp "
        "(FSDP2: weights, gradients and state sharded); launch with --nproc N, torchrun or "
        "accelerate launch.",
        default=DistributedStrategy.NONE)
    nproc: int = doc("Processes: what `memfit train --nproc N` starts on this machine; under "
                     "another launcher (torchrun, accelerate) its WORLD_SIZE, recorded in the "
                     "run's config.yaml.", limits=(1, MAX_DEVICES), default=1)
    sequence_parallel: int = doc(
        "Processes sharing each sequence (Ulysses: each feeds the model 1/N of its tokens, "
        "attention all-to-alls heads); must divide the processes and the model's attention "
        "and key/value heads; with ddp or fsdp, for Llama, Mistral and Qwen2/3 causal LMs.",
        limits=(1, MAX_DEVICES), default=1)


@dataclass(frozen=True)
class LogConfig:
    tensorboard: bool = doc("Write TensorBoard events to the run folder.", default=True)
    progress: bool = doc("Show a progress bar.", default=True)
    every: int = doc("Log metrics every N optimizer steps.", limits=(1, MAX_STEPS), default=1)
    memory_every: str | int = doc(
        "Which steps' memory is measured: auto (every step on CUDA and with memory.budget; "
        "on CPU otherwise steps 1 and 2, where the peak is set, each step whose batches are "
        "larger than any measured before, and every 100th, since the CPU tensor tracker "
        "slows each step it measures) or N, every N-th step (1: each; must be 1 or auto "
        "with memory.budget).",
        limits=(1, MAX_STEPS), default="auto",
    )


@dataclass(frozen=True)
class Config:
    model: ModelConfig = doc("The model to fine-tune.", default_factory=ModelConfig)
    data: DataConfig = doc("The training data.", default_factory=DataConfig)
    adapter: AdapterConfig = doc("Adapters (LoRA / QLoRA).", default_factory=AdapterConfig)
    optimizer: OptimizerConfig = doc("The optimizer.", default_factory=OptimizerConfig)
    precision: Precision = doc(
        "fp32; bf16 or fp16 autocast (fp16 with a gradient scaler); bf16-pure (bf16 "
        "weights, no fp32 master copy).",
        default=Precision.FP32,
    )
    memory: MemoryConfig = doc("Memory-saving techniques.", default_factory=MemoryConfig)
    train: TrainConfig = doc("The training loop.", default_factory=TrainConfig)
    distributed: DistributedConfig = doc("Multi-process training.",
                                         default_factory=DistributedConfig)
    log: LogConfig = doc("Logging.", default_factory=LogConfig)
