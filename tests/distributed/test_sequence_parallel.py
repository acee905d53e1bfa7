"""Sequence parallelism (distributed.sequence_parallel, Ulysses all-to-all attention) on
2 gloo processes, fp32, the tiny Llama (4 heads, 2 key/value heads):

- the all-to-all attention of each rank's slice equals SDPA on the whole sequence, output
  and q/k/v gradients (sequence_attention.py), causal and with padding;
- training 2 processes that share every sequence (sequence_parallel=2, ddp) gives the
  losses of one process training the same sequences, for LoRA and full-parameter AdamW
  with gradient checkpointing, chunked loss and the tiled MLP and norms, and on packed blocks; so
  does FSDP2 sharding over both processes (LoRA and full AdamW, checkpointing, tiled MLP and norms);
- each process holds about half of one process's activation bytes;
- a checkpoint resumes across a change of sequence_parallel (1 -> 2 and 2 -> 1);
- bad values are one-line refusals naming the valid ones.

The 2-process work runs in ONE torchrun job (ddp_jobs.py); the 1-process runs in this
process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ddp_jobs import activation_bytes
from dist_helpers import interrupted_copy, on_two_processes, run_config, write_text_rows
from sequence_cases import CASES, STEPS, case_config, write_instruction_rows
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)

from memfit._utils.errors import ConfigError
from memfit.distributed.sequence_parallel import use_sequence_parallel_attention
from memfit.models.presets import tiny_llama
from memfit.monitor.metrics import losses_by_step, read_metrics
from memfit.techniques.config_checks import load_config
from memfit.training.api import train


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sequence-parallel")
    text = write_text_rows(root / "rows.jsonl")
    instructions = write_instruction_rows(root / "instructions.jsonl")
    jobs: list[dict] = [{"sequence_attention": 2}]
    for case in CASES:
        data = instructions if case == "packed" else text
        if not case.endswith("-fsdp"):  # compared with the unsharded case's single run
            train(case_config(root, f"{case}-single", data, case, 1))
        jobs.append({"train": str(case_config(root, f"{case}-sp2", data, case, 2))})
    # What one forward leaves saved for backward, on one process and on each of 2.
    (root / "activations-single-0.json").write_text(
        json.dumps(activation_bytes(str(root / "packed-single.yaml"))))
    jobs.append({"activations": str(root / "packed-sp2.yaml"),
                 "out": str(root / "activations-sp2")})
    # A checkpoint of one process resumes on 2 sharing its sequences...
    copy, config = _resumed_copy(root, "lora-single", 2)
    jobs.append({"train": str(config), "resume": str(copy)})
    (root / "jobs.json").write_text(json.dumps(jobs))
    job = on_two_processes("ddp_jobs.py", str(root / "jobs.json"), cwd=root)
    assert job.returncode == 0, job.stderr[-4000:]
    # ... and one of 2 sharing sequences resumes on one process.
    copy, config = _resumed_copy(root, "lora-sp2", 1)
    train(config, resume=copy)
    return root


def _resumed_copy(root: Path, run: str, sequence_parallel: int) -> tuple[Path, Path]:
    """``run`` stopped before its last checkpoint, and the config resuming it on
    ``sequence_parallel`` processes that share every sequence (the same global batch)."""
    copy, config = interrupted_copy(root, run, sequence_parallel, STEPS, global_batch=6)
    mapping = yaml.safe_load(config.read_text())
    mapping["train"]["micro_batch_size"] = 3  # the sequence group draws them together
    mapping["distributed"].update(strategy="ddp" if sequence_parallel > 1 else "none",
                                  sequence_parallel=sequence_parallel)
    config.write_text(yaml.safe_dump(mapping))
    return copy, config


@pytest.mark.slow
def test_all_to_all_attention_equals_whole_sequence_sdpa(runs: Path) -> None:
    # The job's first entry raises (and the fixture fails) on any difference.
    assert (runs / "jobs.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_two_processes_sharing_sequences_train_as_one(runs: Path, case: str) -> None:
    single = losses_by_step(read_metrics(runs / f"{case.removesuffix('-fsdp')}-single"))
    split = losses_by_step(read_metrics(runs / f"{case}-sp2"))
    assert sorted(single) == sorted(split) == list(range(1, STEPS + 1))
    assert split == pytest.approx(single, rel=1e-5)
    summary = json.loads((runs / f"{case}-sp2" / "summary.json").read_text())
    assert summary  # the run completed and exported


@pytest.mark.slow
def test_each_process_holds_about_half_the_activations(runs: Path) -> None:
    """What one forward of a micro-batch leaves saved for backward (the tensor tracker's
    activations; the packed LoRA case: no checkpointing): each of the 2 processes holds
    about half of one process's (measured: 0.53; what does not shrink with N includes
    the whole sequences' attention mask, (batch, 1, L, L), and the micro-batch's
    tokens, which every rank of a group holds)."""
    single = json.loads((runs / "activations-single-0.json").read_text())
    for rank in (0, 1):
        split = json.loads((runs / f"activations-sp2-{rank}.json").read_text())
        print(f"rank {rank}: {split:,} of one process's {single:,} activation bytes "
              f"({split / single:.3f})")
        assert 0.45 * single <= split <= 0.55 * single


@pytest.mark.slow
@pytest.mark.parametrize(("run", "processes"), [("lora-single", 2), ("lora-sp2", 1)])
def test_resume_across_a_change_of_sequence_parallel(runs: Path, run: str,
                                                     processes: int) -> None:
    uninterrupted = losses_by_step(read_metrics(runs / "lora-single"))
    resumed = losses_by_step(read_metrics(runs / f"{run}-resumed-on-{processes}"))
    assert list(resumed) == [STEPS]
    assert resumed[STEPS] == pytest.approx(uninterrupted[STEPS], rel=1e-5)


@pytest.mark.parametrize(("overrides", "message"), [
    ([], "distributed.sequence_parallel=2 needs distributed.strategy=ddp"),
    (["distributed.strategy=ddp", "distributed.nproc=6", "distributed.sequence_parallel=4"],
     "distributed.sequence_parallel=4 must divide distributed.nproc=6; valid: 1, 2, 3, 6"),
    (["distributed.strategy=ddp", "distributed.nproc=2", "data.max_length=1"],
     "more than data.max_length=1 tokens"),
    (["distributed.strategy=ddp", "distributed.nproc=2", "model.preset=null",
      "model.factory=my_models:build"], "a model.factory model cannot be split"),
])
def test_bad_values_are_one_line_refusals(tmp_path: Path, overrides: list[str],
                                          message: str) -> None:
    data = write_text_rows(tmp_path / "rows.jsonl", rows=4)
    config = run_config(tmp_path, "refused", data)
    with pytest.raises(ConfigError, match="distributed.sequence_parallel") as error:
        load_config(config, ["distributed.sequence_parallel=2", *overrides])
    assert message in str(error.value) and "\n" not in str(error.value)


def test_heads_and_architecture_refusals() -> None:
    llama = LlamaForCausalLM(tiny_llama())
    with pytest.raises(ConfigError, match=r"must divide the model's 4 attention heads and 2 "
                                          r"key/value heads; valid: 1, 2$"):
        use_sequence_parallel_attention(llama, 4, max_length=48)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32))
    with pytest.raises(ConfigError, match="rotary attention .* this model is gpt2"):
        use_sequence_parallel_attention(gpt2, 2, max_length=48)
    mistral = MistralForCausalLM(MistralConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=32, sliding_window=16))
    with pytest.raises(ConfigError, match="sliding window of 16 tokens.*max_length <= 16$"):
        use_sequence_parallel_attention(mistral, 2, max_length=48)
    use_sequence_parallel_attention(mistral, 2, max_length=16)  # the window never slides
    assert mistral.config._attn_implementation == "memfit_sequence_parallel"
