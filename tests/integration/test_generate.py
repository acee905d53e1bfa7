"""`memfit generate` and data.sample_prompts on one tiny-Llama LoRA run (instruction data).

The oracle is plain transformers: the run merged by `memfit merge`, loaded with
``AutoModelForCausalLM`` and asked with ``model.generate`` (greedy) on the prompt laid out
by hand as the instruction format lays out a row's context (``<s>prompt\\n``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from cli_helpers import assert_one_line_error, run_in_process, tiny_run_arguments, tree_digest

from memfit.generate import answer, open_answerer
from memfit.merge import merge_run
from memfit.models.generation import Decoding
from memfit.models.tokenizers import BOS_ID

pytestmark = pytest.mark.usefixtures("quiet_transformers")

PROMPTS = ["Repeat twice: apple", "Repeat twice: stone cloud"]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished 3-step LoRA run that answered PROMPTS at steps 0, 2 and 3."""
    from cli_helpers import write_instructions

    folder = tmp_path_factory.mktemp("generate")
    data = write_instructions(folder / "rows.jsonl")
    prompts = json.dumps(PROMPTS)
    result = run_in_process("train", *tiny_run_arguments(
        data, folder / "run", "train.max_steps=3", "train.eval_every=2", "optimizer.lr=1e-2",
        "adapter.kind=lora", "adapter.rank=4", "log.tensorboard=true",
        f"data.sample_prompts={prompts}", f"data.sample_max_new_tokens={NEW_TOKENS}"),
        cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder / "run"


@pytest.fixture(scope="module")
def merged(run: Path) -> Path:
    return merge_run(run, run.parent / "merged")


def reference_answer(model_dir: Path, prompt: str) -> str:
    """Greedy generation with transformers alone, on the instruction layout."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = [BOS_ID, *tokenizer(prompt + "\n", add_special_tokens=False)["input_ids"]]
    with torch.no_grad():
        output = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                eos_token_id=tokenizer.eos_token_id,
                                pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(output[0, len(ids):], skip_special_tokens=True)


def test_the_run_and_its_merged_model_answer_as_transformers_does(run: Path, merged: Path):
    expected = [reference_answer(merged, prompt) for prompt in PROMPTS]
    assert any(expected), "the oracle wrote nothing: the test would compare empty strings"

    from_run = run_in_process("generate", str(run), "--prompt", PROMPTS[0],
                              "--max-new-tokens", str(NEW_TOKENS), cwd=run.parent)
    assert from_run.returncode == 0, from_run.stderr
    assert from_run.stdout == expected[0] + "\n"  # streamed, then one newline
    from_merged = open_answerer(merged, data_format="instruction")
    assert [answer(from_merged, prompt, Decoding(NEW_TOKENS)) for prompt in PROMPTS] == expected

    # The answers training logged at its last evaluation came from the same model.
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    logged = [record for record in records if "sample_answers" in record]
    assert [record["step"] for record in logged] == [0, 2, 3]
    assert logged[-1]["sample_answers"] == [
        {"prompt": prompt, "answer": text} for prompt, text in zip(PROMPTS, expected, strict=True)]


def test_a_full_fine_tune_answers_from_its_model_folder(run: Path, tmp_path: Path):
    result = run_in_process("train", *tiny_run_arguments(
        run.parent / "rows.jsonl", tmp_path / "full", "train.max_steps=1",
        "data.eval_fraction=0", "log.tensorboard=false"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    answerer = open_answerer(tmp_path / "full")
    assert answerer.data_format.value == "instruction"
    assert answer(answerer, PROMPTS[0], Decoding(NEW_TOKENS)) == \
        reference_answer(tmp_path / "full" / "model", PROMPTS[0])


def test_sample_answers_reach_tensorboard_and_the_report(run: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    texts = events.Tensors("samples/answers/text_summary")
    assert [event.step for event in texts] == [0, 2, 3]
    assert PROMPTS[1] in texts[-1].tensor_proto.string_val[0].decode()

    result = run_in_process("report", str(run), "--out", str(run.parent / "report.html"),
                            cwd=run.parent)
    assert result.returncode == 0, result.stderr
    page = (run.parent / "report.html").read_text()
    assert "<h2>Sample answers</h2>" in page and f"<th>{PROMPTS[1]}</th>" in page


def test_a_model_folder_gets_the_chat_template_and_sampling_repeats_with_its_seed(
        merged: Path):
    answerer = open_answerer(merged)  # no run: the tokenizer's chat template
    assert answerer.data_format.value == "chat"
    sampled = Decoding(NEW_TOKENS, temperature=1.5, top_p=0.9, seed=7)
    first = answer(answerer, PROMPTS[0], sampled)
    assert answer(answerer, PROMPTS[0], sampled) == first
    pieces: list[str] = []
    assert answer(answerer, PROMPTS[0], sampled, on_text=pieces.append) == first
    assert "".join(pieces) == first


@pytest.mark.parametrize(("arguments", "fragment"), [
    (["--max-new-tokens", "0"], "--max-new-tokens 0: give 1 to"),
    (["--temperature", "-1"], "--temperature -1.0: give 0 (greedy)"),
    (["--top-p", "1.5"], "--top-p 1.5: give a number above 0 and at most 1"),
])
def test_bad_numbers_are_one_line(run: Path, arguments: list[str], fragment: str):
    result = run_in_process("generate", str(run), "--prompt", "hi", *arguments, cwd=run.parent)
    assert_one_line_error(result, 2, fragment)


def test_what_is_no_finished_language_model_run_is_one_line(run: Path, tmp_path: Path):
    (tmp_path / "empty").mkdir()
    cases = {"empty": "neither a run folder (config.yaml) nor a model folder",
             "missing": "no such folder"}
    unfinished = tmp_path / "unfinished"
    shutil.copytree(run, unfinished, ignore=shutil.ignore_patterns("adapter", "tensorboard"))
    cases["unfinished"] = "no adapter/adapter_config.json (the run has not finished"
    foreign = tmp_path / "foreign"
    shutil.copytree(run, foreign, ignore=shutil.ignore_patterns("memfit-run.json"))
    cases["foreign"] = "not a memfit run folder"
    coded = tmp_path / "coded"
    shutil.copytree(run, coded)
    config = yaml.safe_load((coded / "config.yaml").read_text())
    config["model"].update(preset=None, factory="factories:regressor")
    (coded / "config.yaml").write_text(yaml.safe_dump(config))
    cases["coded"] = "names code to import: model.factory='factories:regressor'"
    before = tree_digest(tmp_path)
    for name, fragment in cases.items():
        result = run_in_process("generate", str(tmp_path / name), "--prompt", "hi",
                                cwd=tmp_path)
        assert_one_line_error(result, 2, f"memfit generate {tmp_path / name}", fragment)
    predicted = run_in_process("predict", str(run), str(run.parent / "rows.jsonl"), cwd=tmp_path)
    assert_one_line_error(predicted, 2, "memfit predict answers with classifiers",
                          "use memfit generate")
    assert tree_digest(tmp_path) == before
