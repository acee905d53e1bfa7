"""The ``memfit`` command line: every subcommand, its options and their help."""

from __future__ import annotations

import argparse

from memfit.cli.commands import (
    _command_bench,
    _command_env,
    _command_generate,
    _command_merge,
    _command_plan,
    _command_predict,
    _command_report,
    _command_train,
)

DESCRIPTION = "Fine-tune PyTorch models inside the GPU memory you actually have."


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser whose epilog may be a function, called when its help is shown:
    `memfit train`'s list of keys needs the optimizer specs (and so torch), which no other
    use of the parser should import (`memfit env` reports a broken torch)."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def _config_keys() -> str:
    from memfit.techniques.config_reference import help_text

    return help_text()


def _add_debug(command: argparse.ArgumentParser) -> None:
    # SUPPRESS: a subcommand's default must not overwrite `memfit --debug COMMAND`.
    command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                         help="show tracebacks for errors")


def _add_trust_code(command: argparse.ArgumentParser, what: str) -> None:
    from memfit.config.code_trust import TRUST_FLAG

    command.add_argument(TRUST_FLAG, action="store_true",
                         help=f"with {what}: import the model.factory, model.loss or class-path "
                              "optimizer.name the run folder's config.yaml names (code from a "
                              "run folder never runs without it)")


def build_parser() -> argparse.ArgumentParser:
    from memfit.bench import defaults as bench_defaults
    from memfit.config.choices import TOKEN_FORMATS
    from memfit.config.devices import DATASHEETS

    parser = argparse.ArgumentParser(prog="memfit", description=DESCRIPTION)
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND",
                                     parser_class=_CommandParser)

    train = commands.add_parser(
        "train", help="fine-tune a model (no arguments: the built-in offline demo)",
        description="Fine-tune a model. Without CONFIG.yaml the built-in demo is the base "
                    "config; key=value overrides apply on top.",
        epilog=_config_keys, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("arguments", nargs="*", metavar="[CONFIG.yaml] [key=value ...]")
    train.add_argument("--print-config", action="store_true",
                       help="print the resolved configuration and exit")
    train.add_argument("--resume", metavar="RUN_DIR",
                       help="continue the run in RUN_DIR from its newest checkpoint")
    train.add_argument("--nproc", type=int, metavar="N",
                       help="start N processes on this machine with torch.distributed.run "
                            "(sets distributed.nproc; needs distributed.strategy=ddp or fsdp; "
                            "at most one per GPU, or per CPU core); may stand among the "
                            "overrides")
    _add_trust_code(train, "--resume")
    _add_debug(train)
    train.set_defaults(handler=_command_train)

    merge = commands.add_parser(
        "merge", help="fold a run's trained adapters into the base and save the full model")
    merge.add_argument("run_dir", metavar="RUN_DIR", help="run folder trained with adapters")
    merge.add_argument("--out", required=True, metavar="DIR",
                       help="a new or empty folder for the merged model; never a link, the run "
                            "folder, the current directory, or the run's model.path or data")
    merge.add_argument("--force", action="store_true",
                       help="replace the contents of a non-empty --out folder (the new model is "
                            "written beside it first, then swapped in)")
    _add_trust_code(merge, "merge")
    _add_debug(merge)
    merge.set_defaults(handler=_command_merge)

    generate = commands.add_parser(
        "generate", help="a trained language model answers a prompt, streamed as it writes",
        description="Load a run's result (adapters merged into its base in memory, or its "
                    "model/ folder) or a model folder (memfit merge --out, a local Hugging "
                    "Face causal LM) and answer --prompt. The prompt is laid out as the run's "
                    "data.format lays out a prompt (chat: the tokenizer's chat template; "
                    "instruction: the prompt and a newline; text: continued as it is); a model "
                    "folder gets the chat template when its tokenizer has one. Greedy unless "
                    "--temperature is above 0.")
    generate.add_argument("path", metavar="RUN_OR_MODEL_DIR",
                          help="a run folder of memfit train, or a model folder")
    generate.add_argument("--prompt", required=True, help="what the model answers")
    generate.add_argument("--max-new-tokens", type=int, default=128, metavar="N",
                          help="tokens the answer has at most (default 128)")
    generate.add_argument("--temperature", type=float, default=0.0,
                          help="0 (default): greedy, the most likely token each time; above "
                               "0: sampling, flatter as it grows")
    generate.add_argument("--top-p", type=float, default=1.0,
                          help="sampling: draw from the most likely tokens that together "
                               "have this probability (default 1: all)")
    generate.add_argument("--seed", type=int, help="sampling: the seed, for repeatable draws")
    generate.add_argument("--format", choices=sorted(f.value for f in TOKEN_FORMATS),
                          help="lay the prompt out as this data.format does instead")
    _add_trust_code(generate, "a run folder")
    _add_debug(generate)
    generate.set_defaults(handler=_command_generate)

    predict = commands.add_parser(
        "predict", help="a trained classifier's label for each row of a file, or each image",
        description="One prediction per row of FILE (jsonl, csv or parquet with the run's "
                    "data.text_field; no label needed), as JSON lines {\"row\": index from 0, "
                    "\"label\": class name, \"probability\": its softmax probability}, to "
                    "stdout unless --output is given. For runs of "
                    "model.task=sequence-classification, and of image-classification (FILE: "
                    "an image, array file or folder; each line also names its \"file\").")
    predict.add_argument("run_dir", metavar="RUN_DIR", help="a run folder of memfit train")
    predict.add_argument("file", metavar="FILE", help="the rows to classify")
    predict.add_argument("--output", metavar="OUT.jsonl",
                         help="write the predictions to this new file (or one holding earlier "
                              "predictions) instead of stdout")
    _add_trust_code(predict, "the run folder")
    _add_debug(predict)
    predict.set_defaults(handler=_command_predict)

    plan = commands.add_parser(
        "plan", help="memory of every strategy, and which to use for a budget",
        description="Estimate, without allocating, what training would cost per strategy; "
                    "with --budget (default: the GPU's memory, where one is present), mark "
                    "what fits and recommend one. Without CONFIG.yaml, the built-in demo "
                    "(what memfit train trains with no arguments) is planned, or name the "
                    "model with an override, e.g. model.preset=llama-3.1-8b. With "
                    "--devices N, bytes and --budget are per device; data parallel (ddp) is "
                    "recommended when some strategy fits one device, FSDP2 (fsdp) otherwise, "
                    "and FSDP2 with each sequence split over processes where nothing else "
                    "fits.")
    plan.add_argument("arguments", nargs="*", metavar="[CONFIG.yaml] [key=value ...]")
    plan.add_argument("--budget",
                      help="device memory, e.g. 24GiB, 16GB, 8e9 (above 0, at most 1 EiB); "
                           "marks what fits and recommends one; default: the GPU's memory "
                           "where one is present (--device cuda), else every strategy's "
                           "bytes with no fits column")
    plan.add_argument("--device", default="cuda", metavar="DEVICE",
                      help="cuda (default; the header says when it is assumed: no GPU here) "
                           "counts the CUDA context and allocator overhead; cpu: this machine, "
                           "tensors only; or a GPU not here, by its builtin profile: "
                           f"{', '.join(DATASHEETS)} (its memory the default --budget). Step "
                           "times: this machine's calibration (made on first use) or the "
                           "builtin profile")
    plan.add_argument("--prefer", choices=("quality", "speed"), default="quality",
                      help="quality (default): the most preferred method that fits, at its "
                           "fastest mix; speed: the fastest strategy that fits of the config's "
                           "adapter.kind")
    plan.add_argument("--any-method", action="store_true",
                      help="with --prefer speed: the fastest strategy of any method")
    plan.add_argument("--devices", type=int, metavar="N",
                      help="bytes per device of training as N processes, one device each: "
                           "every strategy under ddp (each holds the whole model) and under "
                           "fsdp (sharded), and where none fits, under fsdp with each "
                           "sequence split over processes (fsdp-spK: "
                           "distributed.sequence_parallel); 1 to 1024; default: "
                           "distributed.nproc")
    plan.add_argument("--max-length", action="store_true",
                      help="instead of the table: the longest data.max_length (up to the "
                           "model's context) that fits --budget on each of --devices "
                           "devices at the configured micro-batch, and the strategy that "
                           "reaches it (over several devices: sharded, and with each "
                           "sequence split)")
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    _add_debug(plan)
    plan.set_defaults(handler=_command_plan)

    bench = commands.add_parser(
        "bench", help="your job under the plan's strategies, or memfit against its peers",
        description="With CONFIG.yaml (or key=value overrides, or --strategies/--top): train "
                    "your own job under the strategies of `memfit plan` — the names "
                    "--strategies gives, or the --top N with the least predicted step time "
                    "that fit — each in its own process with the same batches and seed, and "
                    "put the measured peak and step time beside the planned ones. Without: "
                    "the suite, memfit's strategies and the peers (plain PyTorch, "
                    "bitsandbytes, PEFT, galore-torch, HF Trainer) on one bench model. Either "
                    "way a markdown table is printed and written with PNGs to --out.")
    bench.add_argument("arguments", nargs="*", metavar="[CONFIG.yaml] [key=value ...]",
                       help="your job, as memfit train takes it (no CONFIG.yaml: the demo)")
    bench.add_argument("--strategies", metavar="NAMES",
                       help="your job: comma-separated strategies of `memfit plan` (config: "
                            "the configuration as given), e.g. lora,lora+ckpt")
    bench.add_argument("--top", type=int, metavar="N",
                       help=f"your job: the N strategies with the least predicted step time "
                            f"that fit --budget (default {bench_defaults.TOP})")
    bench.add_argument("--budget",
                       help="your job: what --top must fit, e.g. 24GiB (default: the GPU's "
                            "memory; on a CPU every strategy counts)")
    bench.add_argument("--suite",
                       help="the suite: memory (3 steps, all measured), speed (20), quality "
                            "(60) or all (60); default all")
    bench.add_argument("--model",
                       help="the suite: demo-base (default), tiny-llama, or llama-1b (CUDA "
                            "only)")
    bench.add_argument("--out", default="bench-results", metavar="DIR",
                       help="folder for bench.md, results.json and the PNGs")
    bench.add_argument("--steps", type=int,
                       help=f"optimizer steps per case (default: your job's "
                            f"{bench_defaults.STEPS}, "
                            "the suite's for a suite)")
    bench.add_argument("--cases", metavar="NAMES",
                       help="the suite: a group (all, memfit, peers, gpu-check) or "
                            "comma-separated case names; default all")
    _add_debug(bench)
    bench.set_defaults(handler=_command_bench)

    report = commands.add_parser(
        "report", help="one self-contained HTML page for a finished run",
        description="Write an HTML page (images embedded, opens without a server) with the "
                    "plan next to the measured memory, the memory timeline, loss and eval "
                    "curves, the resolved config and the summary.")
    report.add_argument("run_dir", metavar="RUN_DIR", help="a run folder of memfit train")
    report.add_argument("--out", metavar="FILE", help="default RUN_DIR/report.html")
    _add_debug(report)
    report.set_defaults(handler=_command_report)

    env = commands.add_parser("env", help="versions, devices and which backends work here")
    env.add_argument("--calibrate", action="store_true",
                     help="also measure this device for the planner's step times (a few "
                          "seconds; kept in the user's cache folder)")
    _add_debug(env)
    env.set_defaults(handler=_command_env)
    return parser
