"""Sequence parallelism, Ulysses-style (``distributed.sequence_parallel: N``): the N
processes of a sequence group each feed the model 1/N of every sequence's tokens, so each
holds 1/N of its activations. Attention is the one layer that needs the whole sequence:
an all-to-all turns q/k/v from (this rank's tokens, all heads) into (all tokens, this
rank's heads), attention runs on whole sequences for H/N heads, and a second all-to-all
turns its output back (DeepSpeed-Ulysses). Everything else (embeddings, norms, MLP, the
head, the loss) is per token and runs on the local slice unchanged.

Ranks ``[g * N, (g + 1) * N)`` form sequence group g; the groups are the data-parallel
replicas: every rank of a group draws the same examples (``data_parallel``), so DDP over
all ranks, which SUMS gradients, adds each group's slices' gradients (the all-to-all's
backward returns each rank its share) into the gradient of the group's whole sequences.

Exactness: position ids are the global ones of the slice (rotary embeddings are per
token), labels are shifted on the WHOLE sequence before slicing (a slice's last token
predicts the next slice's first), and the mask attention applies on the gathered sequence
is the one a single process builds: causal, keys of padding excluded, and packed rows
(position ids restarting) kept apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from memfit._utils.errors import ConfigError
from memfit.distributed.process_group import rank, world_size
from memfit.models.export_module import plain_module

ATTENTION = "memfit_sequence_parallel"  # the name registered with transformers
CONTEXT_KEYWORD = "memfit_sequence"  # the forward keyword carrying a SequenceContext
IGNORE_INDEX = -100
# Hugging Face causal LMs whose attention is rotary and goes through transformers'
# attention interface with (batch, heads, tokens, head_dim) q/k/v.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class PlannedGroup:
    """The process group of a sequence group as the planner traces it (plan/workload.py):
    every exchange allocates what the real one allocates, its output, sends nothing and
    counts what it would send (to the group's other ``size - 1`` processes), so the trace
    of one rank's micro-batch counts the bytes and work training's would."""

    size: int
    sent_bytes: int = 0
    exchanges: int = 0

    def exchange(self, tensor: torch.Tensor) -> None:
        self.sent_bytes += tensor.numel() * tensor.element_size() * (self.size - 1) // self.size
        self.exchanges += 1


@dataclass(frozen=True)
class SequenceGroup:
    """This rank's sequence group: ``size`` ranks sharing each sequence, this rank's place
    in it (``index``: which 1/size slice of every sequence it feeds the model)."""

    group: Any  # a torch.distributed ProcessGroup, or a PlannedGroup
    size: int
    index: int


def data_parallel(sequence_parallel: int) -> tuple[int, int]:
    """(data-parallel rank, data-parallel world size): the rank's sequence group and how
    many groups there are. The ranks of a group draw the same examples."""
    return rank() // sequence_parallel, max(world_size() // sequence_parallel, 1)


def check_world(sequence_parallel: int, world: int) -> None:
    if sequence_parallel < 1 or world % sequence_parallel:
        valid = [n for n in range(1, world + 1) if world % n == 0]
        raise ConfigError(f"distributed.sequence_parallel={sequence_parallel} must divide the "
                          f"{world} processes; valid: {', '.join(map(str, valid))}")


def new_group(sequence_parallel: int) -> SequenceGroup:
    """Create every rank's sequence group (``new_group`` is collective: all ranks make all
    groups in the same order) and return this rank's."""
    check_world(sequence_parallel, world_size())
    mine = None
    for start in range(0, world_size(), sequence_parallel):
        ranks = list(range(start, start + sequence_parallel))
        group = dist.new_group(ranks)
        if rank() in ranks:
            mine = SequenceGroup(group, sequence_parallel, rank() - start)
    return mine


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of a (N, ...) tensor with equal chunks: chunk j goes to rank j
    and chunk i of the result came from rank i. Its own reverse: backward sends each
    gradient chunk back to the rank the values came from."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _all_to_all(tensor, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_to_all(grad, ctx.group), None


def _all_to_all(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    # Contiguous in and out: all_to_all_single splits and fills them in memory order (a
    # gradient may arrive with other strides, which empty_like would copy).
    tensor = tensor.contiguous()
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    if isinstance(group, PlannedGroup):
        group.exchange(tensor)
    else:
        dist.all_to_all_single(output, tensor, group=group)
    return output


def tokens_to_heads(tensor: torch.Tensor, sequence: SequenceGroup) -> torch.Tensor:
    """(batch, heads, tokens/N, head_dim) of this rank's tokens -> (batch, heads/N,
    tokens, head_dim) of this rank's heads, the tokens in sequence order."""
    batch, heads, local, head_dim = tensor.shape
    n = sequence.size
    # [N, batch, heads/N, tokens/N, head_dim]: head group j is sent to rank j.
    chunks = tensor.reshape(batch, n, heads // n, local, head_dim).transpose(0, 1)
    received = _AllToAll.apply(chunks.contiguous(), sequence.group)  # chunk i: rank i's tokens
    return received.permute(1, 2, 0, 3, 4).reshape(batch, heads // n, n * local, head_dim)


def heads_to_tokens(tensor: torch.Tensor, sequence: SequenceGroup) -> torch.Tensor:
    """(batch, tokens, heads/N, head_dim) of this rank's heads -> (batch, tokens/N, heads,
    head_dim) of this rank's tokens: the reverse of ``tokens_to_heads``."""
    batch, tokens, heads, head_dim = tensor.shape
    n = sequence.size
    # [N, batch, tokens/N, heads/N, head_dim]: token slice j is sent to rank j.
    chunks = tensor.reshape(batch, n, tokens // n, heads, head_dim).transpose(0, 1)
    received = _AllToAll.apply(chunks.contiguous(), sequence.group)  # chunk i: rank i's heads
    return received.permute(1, 2, 0, 3, 4).reshape(batch, tokens // n, n * heads, head_dim)


@dataclass(frozen=True)
class SequenceContext:
    """What attention needs beyond q/k/v: the group, and the (batch, 1, L, L) boolean mask
    of the whole sequences (True: may attend), or None when plain causal is exact."""

    sequence: SequenceGroup
    mask: torch.Tensor | None


def attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention interface. query (batch, heads, tokens/N, head_dim), key and
    value (batch, kv_heads, tokens/N, head_dim) -> (batch, tokens/N, heads, head_dim). The
    local mask transformers built is replaced by the context's whole-sequence one. Without
    a context (evaluation, generation: whole sequences on every rank) it is plain SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    context: SequenceContext | None = kwargs.pop(CONTEXT_KEYWORD, None)
    if context is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    sequence = context.sequence
    query, key, value = (tokens_to_heads(part, sequence) for part in (query, key, value))
    # (batch, tokens, heads/N, head_dim); GQA is intact: query head group j uses kv group j.
    output, _ = sdpa_attention_forward(module, query, key, value, context.mask, **kwargs)
    return heads_to_tokens(output, sequence), None


def register_attention() -> None:
    """Make ``ATTENTION`` a transformers attention implementation (its masks are SDPA's,
    used when no context replaces them)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register(ATTENTION, attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


def head_splits(model_config: Any) -> list[int]:
    """The group sizes a transformers config's attention allows: those dividing both its
    attention heads and its key/value heads (each rank takes whole heads of both)."""
    heads = model_config.num_attention_heads
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    return [n for n in range(1, kv_heads + 1) if heads % n == 0 and kv_heads % n == 0]


def use_sequence_parallel_attention(model: nn.Module, sequence_parallel: int,
                                    max_length: int) -> None:
    """Switch a supported causal LM (or a PEFT wrapper of one) to ``ATTENTION``; a model
    it cannot split, whose heads ``sequence_parallel`` does not divide, or whose sliding
    window is shorter than ``max_length`` (the whole-sequence mask is plain causal) is
    refused."""
    config = getattr(plain_module(model), "config", None)
    model_type = getattr(config, "model_type", None)
    setting = f"distributed.sequence_parallel={sequence_parallel}"
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(f"{setting} needs a Hugging Face causal LM with rotary attention "
                          f"({', '.join(SUPPORTED_MODEL_TYPES)}); this model is "
                          f"{model_type or type(model).__name__}")
    valid = head_splits(config)
    if sequence_parallel not in valid:
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        raise ConfigError(f"{setting} must divide the model's {heads} attention heads and "
                          f"{kv_heads} key/value heads; valid: {', '.join(map(str, valid))}")
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    sliding = window is not None and ("sliding_attention" in layer_types or not layer_types)
    if sliding and window < max_length:
        raise ConfigError(f"{setting}: this model's attention has a sliding window of "
                          f"{window} tokens, which sequence parallelism does not apply; "
                          f"valid: data.max_length <= {window}")
    register_attention()
    plain_module(model).set_attn_implementation(ATTENTION)


def _pad_to_multiple(batch: dict[str, torch.Tensor], multiple: int) -> dict[str, torch.Tensor]:
    """Right-pad every (batch, L) tensor so L divides by ``multiple``: input ids with 0
    (never attended: the mask excludes them), attention mask 0, labels -100, position ids
    continuing."""
    length = next(iter(batch.values())).shape[1]
    extra = -length % multiple
    if not extra:
        return batch
    padded = {}
    for name, tensor in batch.items():
        if name == "position_ids":
            steps = torch.arange(1, extra + 1, device=tensor.device)
            padded[name] = torch.cat([tensor, tensor[:, -1:] + steps], dim=1)
        else:
            fill = IGNORE_INDEX if name == "labels" else 0
            padded[name] = F.pad(tensor, (0, extra), value=fill)
    return padded


def _whole_sequence_mask(batch: dict[str, torch.Tensor], packed: bool
                         ) -> torch.Tensor | None:
    """(batch, 1, L, L) boolean: causal, and keys of padding excluded (padding before a
    real token) or keys of other packed rows excluded (position ids restarting, as
    transformers' ``find_packed_sequence_indices`` reads them); None when causal alone is
    exact: rows padded at their right end only (memfit's collate and ``_pad_to_multiple``
    pad there), where no real query sees a padding key and a padding query's output
    reaches no target. The planner's fake tensors show no values: its rows are right-padded
    (as training's), its packed rows counted as needing the mask (an upper bound)."""
    length = batch["input_ids"].shape[1]
    device = batch["input_ids"].device
    if packed:
        positions = batch["position_ids"]
        starts = torch.ones_like(positions, dtype=torch.bool)
        starts[:, 1:] = positions[:, 1:] - positions[:, :-1] != 1
        rows = starts.cumsum(dim=1)  # [batch, L]: which packed row each token is in
        if _known_all(rows == 1):
            return None
        allowed = rows[:, :, None] == rows[:, None, :]
    else:
        if "attention_mask" not in batch or _right_padded(batch["attention_mask"]):
            return None
        keys = batch["attention_mask"].bool()  # [batch, L]
        allowed = keys[:, None, :].expand(-1, length, -1)
    # Built only here: (L, L) is 1 GiB at 32,768 tokens, where the plain causal case needs
    # none. Each query keeps itself: a padding query with no key would give NaN (its
    # output reaches no loss, as in one process, where SDPA's mask leaves such rows too).
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    diagonal = torch.eye(length, dtype=torch.bool, device=device)
    return ((allowed & causal) | diagonal)[:, None]


def _known_all(flags: torch.Tensor) -> bool:
    """Whether every flag is known to be True (a fake tensor's values are unknown)."""
    return not is_fake(flags) and bool(flags.all())


def _right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether no row of the (batch, L) mask has a real token after padding."""
    return is_fake(attention_mask) or not bool((attention_mask[:, 1:] > attention_mask[:, :-1])
                                                .any())


def shard_batch(batch: dict[str, torch.Tensor], sequence: SequenceGroup
                ) -> tuple[dict[str, Any], torch.Tensor]:
    """(the model's keyword arguments for this rank's slice, its targets) from a whole
    (batch, L) token batch that every rank of the group holds. Targets are the labels
    shifted on the whole sequence (targets[:, t] = labels[:, t + 1], -100 at the end), so
    no target is lost at a slice's edge and the slices' loss sums add up to one
    process's."""
    packed = batch.get("position_ids") is not None
    batch = {name: batch[name] for name in ("input_ids", "attention_mask", "labels",
                                            "position_ids") if batch.get(name) is not None}
    if not packed:  # what transformers derives from an unpacked batch: 0..L-1
        length = batch["input_ids"].shape[1]
        positions = torch.arange(length, device=batch["input_ids"].device)
        batch["position_ids"] = positions.expand_as(batch["input_ids"])
    batch = _pad_to_multiple(batch, sequence.size)
    labels = batch["labels"]
    targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)
    context = SequenceContext(sequence, _whole_sequence_mask(batch, packed))
    local = batch["input_ids"].shape[1] // sequence.size
    part = slice(sequence.index * local, (sequence.index + 1) * local)
    # attention_mask=None: the mask is the context's; use_cache=False: no cache to fill.
    inputs = {"input_ids": batch["input_ids"][:, part],
              "position_ids": batch["position_ids"][:, part], "attention_mask": None,
              "use_cache": False, CONTEXT_KEYWORD: context}
    return inputs, targets[:, part]


def target_count(batch: dict[str, torch.Tensor], sequence: SequenceGroup) -> int:
    """The targets (labels shifted, not -100) of this rank's slice of ``batch``: summed
    over the group, those of the whole sequences."""
    labels = _pad_to_multiple({"labels": batch["labels"]}, sequence.size)["labels"]
    targets = labels[:, 1:] != IGNORE_INDEX  # [batch, L - 1]; position L - 1 has none
    local = labels.shape[1] // sequence.size
    return int(targets[:, sequence.index * local:(sequence.index + 1) * local].sum())
