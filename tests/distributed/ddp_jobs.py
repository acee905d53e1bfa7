"""A worker for the distributed tests, started once by torchrun with 2 gloo processes:
it runs a list of jobs (JSON) one after the other, so the cases share one start-up of
torch and transformers instead of paying it per case.

    {"train": CONFIG.yaml}                          memfit.train(CONFIG)
    {"train": CONFIG.yaml, "resume": RUN}           memfit.train(CONFIG, resume=RUN)
    {"sequence_attention": N}                       sequence_attention.check_attention
    {"activations": CONFIG.yaml, "out": PREFIX}     PREFIX-R.json: activation_bytes(CONFIG)
    {"state": CONFIG.yaml, "steps": 3, "out": DIR}
        3 optimizer steps of the real training step; each rank then writes what it holds
        to DIR/rank-R.safetensors: its trainable weights (``weight/NAME``; its rows when
        sharded), GaLore projectors P (``projector/NAME``), the gradient scaler's scale
        (``scale``), its optimizer state's bytes as the tensor tracker counts them
        (``optimizer_bytes``) and those of the state every rank holds whole
        (``replicated_bytes``: what a sharded checkpoint saves as plain tensors), and the
        tracker's weight bytes of the quantized layers (``quantized_bytes``: their codes
        and scales, this rank's shards of them when sharded).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from sequence_attention import check_attention
from torch.distributed.tensor import DTensor

from memfit import distributed
from memfit._utils.gc_thresholds import collect_less_often
from memfit.config import Config
from memfit.config.load import read_yaml
from memfit.distributed import sequence_parallel
from memfit.monitor.tensor_tracker import TensorTracker
from memfit.techniques.config_checks import from_mapping
from memfit.techniques.quantize import is_quantized_layer
from memfit.techniques.quantized_shards import PackedQuantizedLinear
from memfit.training.api import train
from memfit.training.batches import BatchStream
from memfit.training.build import build_run
from memfit.training.step import optimizer_step, step_parts


def _optimizers_with_state(optimizer: torch.optim.Optimizer) -> list[torch.optim.Optimizer]:
    inner = getattr(optimizer, "inner_optimizers", None)  # layer-wise: one per parameter
    return inner if inner is not None else [optimizer]


def _state_after_steps(config: Config, steps: int) -> dict[str, torch.Tensor]:
    run = build_run(config)
    stream = BatchStream(run.splits.train, config.train.micro_batch_size, config.train.seed,
                         run.collate, rank=distributed.rank(),
                         world_size=distributed.world_size())
    for _ in range(steps):
        batches = [stream.next_batch() for _ in range(config.train.gradient_accumulation_steps)]
        items = distributed.all_reduce_sum(sum(run.objective.count(b) for b in batches))
        optimizer_step(step_parts(run), batches, items)
    names = {id(p): name for name, p in run.model.named_parameters()}
    found = {f"projector/{names[id(p)]}": state["projector"].contiguous()
             for optimizer in _optimizers_with_state(run.optimizer)
             for p, state in optimizer.state.items()
             if "projector" in state and id(p) in names}  # not under FSDP: keyed by rows
    found.update({f"weight/{name}": _local(p).detach().clone()
                  for name, p in run.model.named_parameters() if p.requires_grad})
    if run.scaler is not None:
        found["scale"] = torch.tensor(run.scaler.get_scale())
    found["optimizer_bytes"] = torch.tensor(_optimizer_bytes(run.optimizer))
    found["quantized_bytes"] = torch.tensor(_quantized_bytes(run.model))
    found["replicated_bytes"] = torch.tensor(sum(
        value.nbytes for entries in run.optimizer.state_dict()["state"].values()
        for value in entries.values()
        if isinstance(value, torch.Tensor) and not isinstance(value, DTensor)))
    if run.replicas is not None:
        run.replicas.close()
    return found


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    tracker = TensorTracker()
    tracker.attach(optimizer=optimizer)  # counts what it holds now
    # Offloaded state is the tracker's host pool (on a CPU device too).
    return tracker.live_by_category()["optimizer"] + tracker.host_live_by_category()["optimizer"]


def _quantized_bytes(model: torch.nn.Module) -> int:
    layers = torch.nn.ModuleList(
        module for module in model.modules()
        if is_quantized_layer(module) or isinstance(module, PackedQuantizedLinear))
    tracker = TensorTracker()
    tracker.attach(model=layers)
    return tracker.live_by_category()["weights"]


def write_state(config_path: str, steps: int, out: Path) -> None:
    config = from_mapping(read_yaml(config_path))
    config = replace(config, distributed=distributed.setup(config.distributed))
    rank = distributed.rank()
    try:
        # Returned, not kept: the run (and its DDP) is gone before the group is destroyed.
        state = _state_after_steps(config, steps)
    finally:
        distributed.teardown()
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, out / f"rank-{rank}.safetensors")


def activation_bytes(config_path: str) -> int:
    """The activation bytes (tensors saved for backward, the tensor tracker's) one forward
    of this rank's first micro-batch leaves alive: with sequence parallelism, of its slice
    of the sequences its group shares."""
    config = from_mapping(read_yaml(config_path))
    config = replace(config, distributed=distributed.setup(config.distributed))
    try:
        run = build_run(config)
        data_rank, data_world = sequence_parallel.data_parallel(
            config.distributed.sequence_parallel)
        batch = BatchStream(run.splits.train, config.train.micro_batch_size,
                            config.train.seed, run.collate, rank=data_rank,
                            world_size=data_world).next_batch()
        tracker = TensorTracker()
        tracker.attach(model=run.model)
        with tracker:
            loss = run.objective.loss_sum(run.model, batch)
            held = tracker.live_by_category()["activations"]
        del loss
        if run.replicas is not None:
            run.replicas.close()
        return held
    finally:
        distributed.teardown()


def join_group_for(job: int) -> None:
    """A process group of its own for each job (memfit.train destroys its group when it
    returns): keys under a fresh prefix of torchrun's store, so no job reads the
    addresses of an earlier job's group."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False)
    dist.init_process_group("gloo", store=dist.PrefixStore(f"job-{job}", store),
                            rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))


def main(jobs_file: str) -> None:
    collect_less_often()  # as memfit's own workers do, before transformers is imported
    for index, job in enumerate(json.loads(Path(jobs_file).read_text())):
        join_group_for(index)
        if "train" in job:
            train(job["train"], resume=job.get("resume"))
        elif "activations" in job:
            held = activation_bytes(job["activations"])
            Path(f"{job['out']}-{os.environ['RANK']}.json").write_text(json.dumps(held))
        elif "sequence_attention" in job:
            check_attention(padded=False, size=job["sequence_attention"])
            check_attention(padded=True, size=job["sequence_attention"])
            dist.destroy_process_group()
        else:
            write_state(job["state"], job["steps"], Path(job["out"]))


if __name__ == "__main__":
    main(sys.argv[1])
