"""What memfit knows about one memory technique, in one place: ``TechniqueSpec``.

Training applies it (training/build.py, stage by stage, through techniques/registry.py) and
checks that it applied; the planner builds the meta model with it (plan/meta.py) or counts
it where ``plan`` says; the registry's tests check that every technique key of the config
has a spec. One file per technique in this package holds its spec.

Every callable of a spec is a function of the technique options, ``(options)``, of a
model and those options, ``(model, options)``, or of what it changes and the setting it
changes it in, ``(subject, setting)``. ``TechniqueOptions`` holds the sections a memory
technique may read (the model, the adapter, the precision, memory.* and the distribution
strategy): never the optimizer, data, train or log sections, as an optimizer spec gets
only its ``OptimizerSetting``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from torch import nn

from memfit.config.ignored import Rule
from memfit.config.schema import MemoryConfig
from memfit.techniques.moments import Moment, StepBytes
from memfit.techniques.technique_options import TechniqueOptions

Stage = Literal["load", "model", "device", "optimizer", "step"]
# The planner's levels beyond plain (plan/strategies.py), in order: a level's rows switch on
# the techniques of every level up to it.
PlanLevel = Literal["+ckpt", "+offload"]
PLAN_LEVELS: tuple[PlanLevel, ...] = ("+ckpt", "+offload")
# A method the planner compares: its row name and the config overrides that make it.
PlanMethod = tuple[str, Mapping[str, Any]]
STAGES: tuple[Stage, ...] = ("load", "model", "device", "optimizer", "step")


@dataclass(frozen=True)
class Setting:
    """What applying a technique needs beside its options."""

    options: TechniqueOptions
    is_transformers: bool
    device: str  # "cuda" or "cpu": the device trained on, or planned for
    # The loaded model's output layer, found before checkpointing and adapters wrap it.
    output_layer: nn.Module | None


def setting(model: nn.Module, options: TechniqueOptions, is_transformers: bool, device: str
            ) -> Setting:
    get_head = getattr(model, "get_output_embeddings", None)
    return Setting(options, is_transformers, device, get_head() if callable(get_head) else None)


# (subject, setting) -> subject: the nn.Module in the load, model and device stages, the
# torch.optim.Optimizer in the optimizer stage.
Apply = Callable[[Any, Setting], Any]


def nothing_to_check(model: nn.Module, options: TechniqueOptions) -> list[str]:
    return []


@dataclass(frozen=True)
class BlockRule:
    """How a technique that acts on some of a model's repeated blocks says which: the
    planner measures shortened stand-ins whose blocks are all of one kind (each such
    technique acting on them or not) and adds the kinds up (plan/itemize.py), so a
    technique on the first N blocks is planned as it trains at every depth."""

    # (memory.*, the depth, the model as named for messages) -> per block, input side
    # first: does it act on that block?
    acts_on: Callable[[MemoryConfig, int, str], list[bool]]
    # memory.* under which it acts on every block (True) or on none (False) of a stand-in,
    # whatever its depth; what lies outside the blocks unchanged.
    everywhere: Callable[[MemoryConfig, bool], MemoryConfig]


@dataclass(frozen=True)
class TechniqueSpec:
    name: str
    keys: tuple[str, ...]  # config keys ("memory.chunked_loss") or values ("precision=fp16")
    stage: Stage
    enabled: Callable[[TechniqueOptions], bool]
    plan: str  # the planner's view, where plan_apply does not say it all
    # Its row in README.md's "Saving memory" table (techniques/docs_table.py), beside its
    # keys.
    docs_row: str
    apply: Apply | None = None  # None: the stage's code runs it (training.loop, objective)
    # "Did it apply?" on the trained model: its warnings; raises ConfigError when it did not.
    check_applied: Callable[[nn.Module, TechniqueOptions], list[str]] = nothing_to_check
    # The planner's view on the meta model, where the planner applies it too.
    plan_apply: Callable[[nn.Module, Setting], nn.Module] | None = None
    # Its keys that other settings make ignored (config/ignored.py's rules, warned about
    # whenever they apply), as an optimizer spec's ``ignored``.
    ignored: tuple[Rule, ...] = ()
    # Overrides on the tiny Llama that turn it on, planned against the measured peak by
    # tests/unit/plan/test_accuracy.py (None: a case there already covers it).
    plan_case: Mapping[str, Any] | None = None
    # Its moments of the run where the steps do not cover it (quantizing the base while
    # loading), planned like the optimizer's and the strategy's (plan/moments.py).
    moments: Callable[[StepBytes, TechniqueOptions], list[Moment]] | None = None
    # The planner's strategy rows (plan/strategies.py). ``row_reset``: keys every row puts
    # back to their defaults unless its method or level sets them: a technique that
    # changes what is trained (which weights, how the base is stored) or how much a level
    # covers, so no row inherits the user's choice of it. ``level``: the level whose rows
    # switch it on (its first row_reset key set true). ``plan_methods``: the methods it
    # makes (adapters: lora, qlora), in order of preference.
    row_reset: tuple[str, ...] = ()
    level: PlanLevel | None = None
    plan_methods: tuple[PlanMethod, ...] = ()
    # Its own keys (techniques/own_keys.py): a frozen dataclass of doc() fields written as
    # memory.<key>, read with ``own_keys.technique_options(Block, memory, name)``;
    # docs/config.md, --help and the load's checks take them from here.
    own: type | None = None
    # Where it acts on some blocks only (the first N): which, for the planner.
    blocks: BlockRule | None = None
