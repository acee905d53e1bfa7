"""Which rows of a fused attention projection are the query, key and value.

One module computes q, k and v together in many models: timm's ViT (``qkv``, an
nn.Linear with out = 3 * dim rows ``[q; k; v]``), GPT-2 (``c_attn``, a transformers
Conv1D whose weight is (in, 3 * dim), so the parts are its output *columns*), MPT
(``Wqkv``), Phi-3 (``qkv_proj``: rows ``[q; k; v]`` with q = heads * head_dim and
k = v = kv_heads * head_dim under grouped-query attention) and torch's
nn.MultiheadAttention (``in_proj_weight``, (3 * embed_dim, embed_dim)).

``adapter.targets`` names parts with the kinds ``attention-q``, ``attention-k``,
``attention-v`` (``attention-qv`` is q and v): on such a module they place one low-rank
update per named part on that part's rows only, so the other rows stay as the base had
them, bit for bit, after a merge. GPT-NeoX's ``query_key_value`` interleaves q, k, v per
head and ``in_proj`` Linears are not always attention (Mamba): those are adapted whole.
"""

from __future__ import annotations

from torch import nn

from memfit._utils.errors import ConfigError

PARTS = ("q", "k", "v")
# adapter.targets kind -> the parts it places on a fused projection
PART_KINDS = {"attention-q": ("q",), "attention-k": ("k",), "attention-v": ("v",),
              "attention-qv": ("q", "v")}
# Leaf names of Linear / Conv1D projections whose output is the blocks [q; k; v].
BLOCKED_QKV = {"qkv", "qkv_proj", "c_attn", "Wqkv"}

Rows = dict[str, tuple[int, int]]  # part -> [start, stop) of the fused output


def is_conv1d(module: nn.Module) -> bool:
    """transformers' Conv1D (GPT-2): a Linear whose weight is stored (in, out). By name, so
    that placing adapters needs no transformers import."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def fused_width(module: nn.Module) -> int | None:
    """Output features of a fused projection whose parts can be placed, else None:
    an nn.MultiheadAttention with one in_proj_weight, or a Linear / Conv1D."""
    if isinstance(module, nn.MultiheadAttention):
        return module.in_proj_weight.shape[0] if module._qkv_same_embed_dim else None
    if isinstance(module, nn.Linear):
        return module.out_features
    if is_conv1d(module):
        return module.nf
    return None


def is_blocked_qkv(name: str, module: nn.Module) -> bool:
    """A module whose q, k, v parts ``rows_of`` can locate."""
    if isinstance(module, nn.MultiheadAttention):
        return fused_width(module) is not None
    return name.rsplit(".", 1)[-1] in BLOCKED_QKV and fused_width(module) is not None


def rows_of(name: str, module: nn.Module, model_config: object | None,
            parts: tuple[str, ...]) -> Rows:
    """The rows of ``parts`` in ``module`` (``name`` in the model): equal thirds, or under
    grouped-query attention the sizes the model's config gives (num_attention_heads,
    num_key_value_heads, head_dim), or a ConfigError when neither fits its width."""
    width = fused_width(module)
    assert width is not None, name
    q_rows = kv_rows = None
    heads = getattr(model_config, "num_attention_heads", None)
    kv_heads = getattr(model_config, "num_key_value_heads", None)
    if not isinstance(module, nn.MultiheadAttention) and heads and kv_heads:
        head_dim = (getattr(model_config, "head_dim", None)
                    or model_config.hidden_size // heads)
        q_rows, kv_rows = heads * head_dim, kv_heads * head_dim
    elif width % 3 == 0:
        q_rows = kv_rows = width // 3
    if q_rows is None or q_rows + 2 * kv_rows != width:
        raise ConfigError(f"adapter.targets: {name} has {width} output rows, which do not "
                          "split into q, k, v blocks (equal thirds, or num_attention_heads / "
                          "num_key_value_heads of model.config); target it whole with "
                          "adapter.targets=attention or leave it out with adapter.restrict_to")
    starts = {"q": (0, q_rows), "k": (q_rows, q_rows + kv_rows),
              "v": (q_rows + kv_rows, width)}
    return {part: starts[part] for part in PARTS if part in parts}


def parts_named(targets: tuple[str, ...]) -> tuple[str, ...]:
    """The parts the part kinds among ``targets`` name, in q, k, v order."""
    named = {part for target in targets for part in PART_KINDS.get(target, ())}
    return tuple(part for part in PARTS if part in named)
