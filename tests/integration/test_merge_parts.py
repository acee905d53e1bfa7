"""`memfit merge` of LoRA on q and v parts of fused projections (nn.MultiheadAttention's
in_proj_weight, a timm-style qkv Linear) beside a same-padding Conv1d subclass:
``adapter/parts.json`` says which rows, the
merged model computes what the adapted one did and its key rows are the base's, bit for
bit; a parts record that does not fit the base, or none, is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from factories import attention_regressor, write_regression_data
from peft import set_peft_model_state_dict
from safetensors.torch import load_file

from memfit._utils.errors import ConfigError
from memfit.config.load import read_yaml
from memfit.merge import merge_run
from memfit.techniques import lora
from memfit.techniques.config_checks import from_mapping, load_config
from memfit.training.api import train
from memfit.training.build import load_base, seed_everything


@pytest.fixture(scope="module")
def parts_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("parts-run")
    data = write_regression_data(folder / "regression.npz")
    return train(load_config(None, [
        "model.factory=factories:attention_regressor", "model.task=custom",
        f"data.path={data}", "data.format=tensors", "train.max_steps=4", "optimizer.lr=5e-2",
        "adapter.kind=lora", "adapter.rank=2", "adapter.targets=[attention-qv, conv]",
        f"train.output_dir={folder / 'run'}", "log.tensorboard=false",
        "log.progress=false"])).output_dir


def test_the_merged_model_computes_the_adapted_one_and_keeps_its_key_rows(
        tmp_path: Path, parts_run: Path):
    assert json.loads((parts_run / "adapter/parts.json").read_text()) == {
        "self_attention": {"q": [0, 16], "v": [32, 48]},
        "attn.qkv": {"q": [0, 16], "v": [32, 48]}}
    assert "parts q,v only" in (parts_run / "adapters.txt").read_text()
    config = from_mapping(read_yaml(parts_run / "config.yaml"))
    seed_everything(config.train.seed)
    adapted = lora.apply(load_base(config).model, config.adapter)
    set_peft_model_state_dict(adapted, load_file(parts_run / "adapter/adapter_model.safetensors"))
    base = adapted.get_base_model()
    out = merge_run(parts_run, tmp_path / "merged", trust_code=True)
    merged = attention_regressor().eval()
    merged.load_state_dict(load_file(out / "model.safetensors"), strict=True)
    assert torch.equal(merged.self_attention.in_proj_weight[16:32],
                       base.self_attention.base_layer.in_proj_weight[16:32])
    assert torch.equal(merged.attn.qkv.weight[16:32], base.attn.qkv.base_layer.weight[16:32])
    assert not torch.equal(merged.attn.qkv.weight[:16], base.attn.qkv.base_layer.weight[:16])
    assert not torch.equal(merged.mix.weight, base.mix.base_layer.weight)
    inputs = torch.randn(5, 8)
    with torch.no_grad():
        torch.testing.assert_close(merged.predict(inputs), adapted.eval().base_model.model
                                   .predict(inputs), rtol=0, atol=1e-5)


@pytest.mark.parametrize(("record", "message"), [
    ({"attn.qkv": {"q": [0, 16], "v": [32, 60]}},
     "attn.qkv has 48 rows in the base, but its parts reach row 60"),
    ({"attn.qkv": {"v": [32, 48], "q": [0, 16]}}, "memfit merge needs parts among q, k, v in "
                                                   "that order"),
    ({"head": {"q": [0, 1]}}, "'head' is not among the target_modules"),
    (None, r"tensor\(s\) match nothing in the adapter"),
])
def test_a_parts_record_that_does_not_fit_is_refused_in_one_line(
        tmp_path: Path, parts_run: Path, record, message):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(parts_run, run)
    if record is None:
        (run / "adapter/parts.json").unlink()
    else:
        (run / "adapter/parts.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=message) as caught:
        merge_run(run, tmp_path / "merged", trust_code=True)
    assert "\n" not in str(caught.value)
