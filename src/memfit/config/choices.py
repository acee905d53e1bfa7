"""The closed sets of strings the configuration accepts (schema.py's field types): a
key typed with one of these takes exactly its members' values.
"""

from __future__ import annotations

from enum import Enum


class Choice(str, Enum):
    """A closed set of strings; ``str(member)`` is the value users write."""

    def __str__(self) -> str:
        return self.value


class Task(Choice):
    CAUSAL_LM = "causal-lm"
    SEQUENCE_CLASSIFICATION = "sequence-classification"
    IMAGE_CLASSIFICATION = "image-classification"
    AUTOENCODER = "autoencoder"
    CUSTOM = "custom"


# Tasks whose model predicts one class per example (model.labels, model.num_labels).
CLASSIFYING_TASKS = frozenset({Task.SEQUENCE_CLASSIFICATION, Task.IMAGE_CLASSIFICATION})


class ModelDtype(Choice):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class DataFormat(Choice):
    TEXT = "text"
    INSTRUCTION = "instruction"
    CHAT = "chat"
    TENSORS = "tensors"
    IMAGES = "images"
    CLASSIFICATION = "classification"


# Formats whose examples are token sequences (data.max_length tokens each).
TOKEN_FORMATS = frozenset({DataFormat.TEXT, DataFormat.INSTRUCTION, DataFormat.CHAT})


class ImageResize(Choice):
    CROP = "crop"
    STRETCH = "stretch"


class ImageNormalize(Choice):
    AUTO = "auto"
    MINMAX = "minmax"


class ReconstructionLoss(Choice):
    MSE = "mse"
    L1 = "l1"


class RopeScaling(Choice):
    """model.rope_scaling.type: transformers' names for its RoPE scaling methods
    (modeling_rope_utils.ROPE_INIT_FUNCTIONS)."""

    NONE = "none"
    LINEAR = "linear"
    DYNAMIC = "dynamic"
    YARN = "yarn"
    LLAMA3 = "llama3"


class AdapterKind(Choice):
    NONE = "none"
    LORA = "lora"
    QLORA = "qlora"


class BaseQuantization(Choice):
    NF4 = "nf4"
    INT8 = "int8"


class GaloreProjector(Choice):
    SVD = "svd"
    RANDOMIZED_SVD = "randomized_svd"
    ONLINE = "online"
    RANDOM = "random"
    APOLLO_MINI = "apollo_mini"


class GaloreInner(Choice):
    ADAMW = "adamw"
    ADAMW8BIT = "adamw8bit"
    ADAFACTOR = "adafactor"


class SubspaceChange(Choice):
    KEEP = "keep"
    RESET = "reset"
    REPROJECT = "reproject"


class LayerwiseRefresh(Choice):
    MICRO_BATCH = "micro_batch"
    FULL_GRADIENT = "full_gradient"


class Precision(Choice):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    BF16_PURE = "bf16-pure"


class LrSchedule(Choice):
    CONSTANT = "constant"
    LINEAR = "linear"
    COSINE = "cosine"


class NonfiniteAction(Choice):
    STOP = "stop"
    SKIP = "skip"


class DistributedStrategy(Choice):
    NONE = "none"
    DDP = "ddp"
    FSDP = "fsdp"


class OomRung(Choice):
    FASTEST = "fastest"
    IN_ORDER = "in_order"
