"""Planning a ``model.factory`` that loads a Hugging Face model with ``from_pretrained``.

The planner runs the factory under ``torch.device("meta")``, where transformers refuses
``from_pretrained`` (it would read every weight only to drop it). Inside
``from_pretrained_on_meta()``, ``from_pretrained`` on any ``PreTrainedModel`` class
(``AutoModel*`` classes end there too) instead reads the folder's ``config.json`` and
builds the same architecture with ``from_config``, as the planner builds ``model.path``:
no weight file is opened, so a 70B factory is planned in seconds and without its memory.
Keyword arguments go where transformers sends them: config fields (``num_labels``,
``id2label``) into the config, model arguments (``add_pooling_layer``) to the model;
loading-only ones (``device_map``, ``dtype``, ...) are dropped: the planner casts the whole
factory model to ``model.dtype``, as training does.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from memfit._utils.errors import ModelError

# Where the config is read from; passed on to the config's from_pretrained.
_HUB_ARGUMENTS = ("cache_dir", "force_download", "local_files_only", "token", "revision",
                  "subfolder", "proxies", "_from_auto", "_from_pipeline")
# How weights would be read, placed or quantized (transformers 4.46 to 5.x): nothing to
# build on meta. Quantized loading (quantization_config, load_in_4bit) is planned from
# adapter.kind=qlora instead.
_LOADING_ARGUMENTS = frozenset({
    "ignore_mismatched_sizes", "use_safetensors", "weights_only", "fusion_config",
    "disable_mmap", "state_dict", "from_tf", "from_flax", "resume_download",
    "use_auth_token", "mirror", "_fast_init", "low_cpu_mem_usage", "offload_state_dict",
    "device_map", "max_memory", "offload_folder", "offload_buffers", "device_mesh",
    "quantization_config", "load_in_8bit", "load_in_4bit", "dtype", "torch_dtype",
    "variant", "gguf_file", "tp_plan", "tp_size", "distributed_config", "key_mapping",
    "use_kernels", "kernel_config", "allow_all_kernels", "generation_config",
    "adapter_kwargs", "adapter_name", "trust_remote_code", "tqdm_class",
    "_commit_hash",
})


@contextlib.contextmanager
def from_pretrained_on_meta() -> Iterator[None]:
    """Within: ``PreTrainedModel.from_pretrained`` builds from config.json on meta."""
    from transformers import PreTrainedModel

    original = PreTrainedModel.__dict__["from_pretrained"]
    PreTrainedModel.from_pretrained = classmethod(_from_config_on_meta)
    try:
        yield
    finally:
        PreTrainedModel.from_pretrained = original


def _from_config_on_meta(cls: type, pretrained_model_name_or_path: Any, *model_args: Any,
                         config: Any = None, output_loading_info: bool = False,
                         **kwargs: Any) -> nn.Module | tuple[nn.Module, dict[str, list]]:
    from transformers import PretrainedConfig

    if model_args:
        raise ModelError(f"{cls.__name__}.from_pretrained got positional model arguments; "
                         "planning builds the model from its config and needs them as "
                         "keywords (e.g. add_pooling_layer=False)")
    hub = {key: kwargs.pop(key) for key in _HUB_ARGUMENTS if key in kwargs}
    kwargs = {key: value for key, value in kwargs.items() if key not in _LOADING_ARGUMENTS}
    if isinstance(config, PretrainedConfig):
        config = copy.deepcopy(config)  # from_config records the dtype on it
    else:
        # Config fields among kwargs update the config; the rest are the model's arguments.
        config, kwargs = cls.config_class.from_pretrained(
            config or pretrained_model_name_or_path, return_unused_kwargs=True, **hub, **kwargs)
    with torch.device("meta"):
        model = cls._from_config(config, **kwargs)
    model.eval()  # as from_pretrained returns it
    if output_loading_info:  # nothing was loaded, so nothing is missing or unexpected
        return model, {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [],
                       "error_msgs": []}
    return model
