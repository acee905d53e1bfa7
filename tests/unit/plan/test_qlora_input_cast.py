"""A QLoRA plan traces PEFT's bitsandbytes wrappers as the device runs them: under CUDA
autocast (``torch.is_autocast_enabled()`` on) they pass the adapters their input uncast,
under CPU autocast and without autocast they cast it to the adapters' fp32
(plan/meta.py, _as_peft_quantized_layers). A CUDA plan of a bf16 run must not count the
casts' copies of the projections' ``[tokens, hidden]`` bf16 inputs."""

from __future__ import annotations

from memfit.plan import estimate, itemize, meta
from memfit.plan.planner import load_plan_config
from memfit.techniques.quantize_stand_in import QuantizedLinear

TOKENS, HIDDEN = 256, 64  # tiny-llama: hidden 64


ARGS = ["model.preset=tiny-llama", f"data.max_length={TOKENS}", "train.micro_batch_size=1",
        "adapter.kind=qlora", "adapter.targets=[attention]"]


def tiny_qlora(precision: str):
    return load_plan_config(None, [*ARGS, f"precision={precision}"])


def casts(config, device: str) -> set[bool]:
    model = meta.build(config, device=device).model
    return {module.cast_input_dtype_enabled for module in model.modules()
            if isinstance(getattr(module, "base_layer", None), QuantizedLinear)}


def clear_caches() -> None:
    itemize._SIZING_CACHE.clear()
    itemize._TRACE_CACHE.clear()


def test_only_a_cuda_plan_under_autocast_leaves_the_adapters_input_uncast():
    assert casts(tiny_qlora("bf16"), "cuda") == {False}
    assert casts(tiny_qlora("bf16"), "cpu") == {True}
    assert casts(tiny_qlora("fp32"), "cuda") == {True}


def test_the_cuda_plan_counts_no_copy_of_the_projections_inputs(monkeypatch):
    # Checkpointed, as long sequences run: the peak is in one block's recomputed backward.
    config = load_plan_config(None, [*ARGS, "precision=bf16",
                                     "memory.gradient_checkpointing=true"])
    clear_caches()
    cuda = estimate(config, "cuda")
    monkeypatch.setattr(meta, "AUTOCAST_DTYPES", {})  # the wrappers cast, as before
    clear_caches()
    casting = estimate(config, "cuda")
    clear_caches()
    saved = casting.bytes["activations"] - cuda.bytes["activations"]
    # At least one [tokens, hidden] bf16 copy fewer at the peak (how many of a block's four
    # are alive there depends on the moment; Llama-3.1-8B's plan: all four).
    assert saved >= TOKENS * HIDDEN * 2, (casting.bytes, cuda.bytes)
    assert cuda.peak_tensor_bytes < casting.peak_tensor_bytes
