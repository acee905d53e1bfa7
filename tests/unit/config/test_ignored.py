"""Which keys count as the user's choices, and which of them the config ignores."""

from __future__ import annotations

import warnings

import pytest

from memfit.config import to_mapping
from memfit.config.ignored import IgnoredKeyWarning, chosen_keys, ignored_keys
from memfit.techniques.config_checks import from_mapping

BASE = {"model": {"preset": "tiny-llama"}, "data": {"path": "rows.jsonl"}}


def test_a_partial_mapping_chooses_what_it_names():
    raw = {**BASE, "adapter": {"kind": "none", "rank": 8}}
    with pytest.warns(IgnoredKeyWarning):
        config = from_mapping(raw)
    assert chosen_keys(config, raw) == {"model.preset", "data.path", "adapter.kind",
                                        "adapter.rank"}
    assert ignored_keys(config, chosen_keys(config, raw)) == [
        "adapter.rank=8 is ignored: adapter.kind=none trains the weights themselves, "
        "without adapters"]


def test_a_complete_mapping_chooses_only_what_differs_from_the_default():
    # A run's config.yaml names every key; read back by --resume it must not warn about
    # every default the rest of the config ignores.
    with pytest.warns(IgnoredKeyWarning):
        config = from_mapping({**BASE, "optimizer": {"galore": {"rank": 4}}})
    written = to_mapping(config)
    assert chosen_keys(config, written) == {"model.preset", "data.path",
                                            "optimizer.galore.rank"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from_mapping(to_mapping(from_mapping(BASE)))
    assert not [w for w in caught if issubclass(w.category, IgnoredKeyWarning)]


@pytest.mark.parametrize("raw, key", [
    ({"train": {"max_steps": 3, "epochs": 2}}, "train.epochs"),
    ({"memory": {"checkpoint_every": 2}}, "memory.checkpoint_every"),
    ({"memory": {"mlp_chunk_tokens": 512}}, "memory.mlp_chunk_tokens"),
    ({"model": {"preset": "conv-autoencoder", "task": "autoencoder"},
      "data": {"format": "images", "pack": False}}, "data.pack"),
    ({"data": {"images": {"size": 32}}}, "data.images.size"),
    ({"adapter": {"kind": "lora", "frozen_in_compute_dtype": False}},
     "adapter.frozen_in_compute_dtype"),
    ({"optimizer": {"name": "galore", "galore": {"projector": "random",
                                                  "project_in_backward": False}}},
     "optimizer.galore.project_in_backward"),
    ({"optimizer": {"name": "galore", "galore": {"projector": "apollo_mini", "rank": 8}}},
     "optimizer.galore.rank"),
    ({"optimizer": {"name": "torch.optim:SGD", "eps": 1e-6}}, "optimizer.eps"),
    ({"optimizer": {"kwargs": {"momentum": 0.9}}}, "optimizer.kwargs.momentum"),
    ({"train": {"max_consecutive_skips": 2}}, "train.max_consecutive_skips"),
    ({"data": {"eval_path": "eval.jsonl", "eval_fraction": 0.2}}, "data.eval_fraction"),
    ({"data": {"label_field": "topic"}}, "data.label_field"),
    ({"data": {"format": "instruction", "text_field": "body"}}, "data.text_field"),
    ({"model": {"num_labels": 3}}, "model.num_labels"),
    ({"model": {"preset": "conv-classifier", "task": "image-classification"},
      "data": {"format": "images", "images": {"target_contrast": []}}},
     "data.images.target_contrast"),
])
def test_each_rule_names_the_key(raw, key):
    merged = {**BASE, **raw, "data": {**BASE["data"], **raw.get("data", {})},
              "model": {**BASE["model"], **raw.get("model", {})}}
    with pytest.warns(IgnoredKeyWarning, match=rf"^{key}=\S+ is ignored: "):
        from_mapping(merged)


def test_image_classification_reads_the_class_keys_and_images_go_with_it():
    raw = {"model": {"preset": "conv-classifier", "task": "image-classification",
                     "labels": ["cat", "dog"], "num_labels": 2},
           "data": {"path": "train", "format": "images", "images": {"size": 16}}}
    with warnings.catch_warnings():
        warnings.simplefilter("error", IgnoredKeyWarning)
        config = from_mapping(raw)
    assert config.model.labels == ("cat", "dog")


@pytest.mark.parametrize("model, data, message", [
    ({"task": "image-classification"}, {"format": "classification"},
     "model.task=image-classification needs data.format=images"),
    ({"task": "sequence-classification", "path": "base"}, {"format": "images"},
     "data.format=images needs model.task autoencoder, image-classification or custom"),
    ({"task": "image-classification", "factory": "m:f", "loss": "m:l"}, {"format": "images"},
     "model.task=image-classification trains with cross-entropy"),
    ({"task": "image-classification", "labels": ["cat"]}, {"format": "images"},
     "model.labels=['cat'] must name at least 2 classes"),
])
def test_image_classification_combinations_are_one_line_errors(model, data, message):
    from memfit._utils.errors import ConfigError

    source = {} if "path" in model or "factory" in model else {"preset": "conv-classifier"}
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        from_mapping({"model": {**source, **model}, "data": {"path": "train", **data}})


def test_a_complete_mapping_naming_own_keys_at_their_defaults_chooses_none_of_them():
    # A config.yaml written while the chunk sizes were schema keys names them at their
    # defaults; now the specs' own keys, they are not choices the rest ignores on --resume.
    written = to_mapping(from_mapping(BASE))
    written["memory"].update(loss_chunk_tokens=1024, mlp_chunk_tokens=4096,
                             norm_chunk_tokens=4096)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from_mapping(written)
    assert not [w for w in caught if issubclass(w.category, IgnoredKeyWarning)]
    written["memory"]["mlp_chunk_tokens"] = 512  # a value of the user's is still named
    with pytest.warns(IgnoredKeyWarning, match="memory.mlp_chunk_tokens=512 is ignored"):
        from_mapping(written)
