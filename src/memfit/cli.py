"""The ``memfit`` command: argument parsing and printing only; the work is in the library.

Expected failures (``MemfitError``) print one line and exit 2; ``--debug`` shows the
traceback instead. memfit's own warnings are one ``memfit: warning:`` line each; other
libraries' warnings and logging below ERROR are shown only with ``--debug``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import warnings
from pathlib import Path

from memfit._utils.broken_imports import diagnose as broken_library
from memfit._utils.errors import (
    ConfigError,
    MemfitError,
    MemfitWarning,
    Stopped,
    is_disk_full,
)
from memfit._utils.sizes import format_bytes

DESCRIPTION = "Fine-tune PyTorch models inside the GPU memory you actually have."
DISK_FULL = ("the disk is full (no space left on device); free some space, or move the run "
             "folder to another disk, then resume it")


def _split_arguments(arguments: list[str]) -> tuple[str | None, list[str]]:
    """``[CONFIG.yaml] [key=value ...]`` -> (config path or None, overrides)."""
    config_path, overrides = None, []
    for argument in arguments:
        if "=" in argument:
            overrides.append(argument)
        elif config_path is None:
            config_path = argument
        else:
            raise MemfitError(
                f"unexpected argument {argument!r}: give one CONFIG.yaml, then key=value overrides"
            )
    return config_path, overrides


def _resolve_train_config(args: argparse.Namespace):
    from memfit.config.code_trust import refuse_untrusted_code
    from memfit.config.load import read_yaml
    from memfit.techniques.config_checks import load_config

    config_path, overrides = _split_arguments(args.arguments)
    if args.resume:
        saved = Path(args.resume) / "config.yaml"
        if not saved.is_file():
            raise MemfitError(f"--resume {args.resume}: no config.yaml there (not a run folder)")
        if config_path:
            raise MemfitError("--resume takes its config from the run folder; give only overrides")
        config = load_config(saved, overrides)
        refuse_untrusted_code(config, f"--resume {args.resume}: its config.yaml", args.trust_code)
        return config
    if config_path is None:
        # No config file: the built-in demo is the base, overrides apply on top of it.
        from memfit.demo.defaults import demo_config_path

        return load_config(None, overrides, base=read_yaml(demo_config_path()))
    return load_config(config_path, overrides)


def _command_train(args: argparse.Namespace) -> int:
    from memfit.config import to_yaml
    from memfit.distributed.launch import check_process_count, launch, should_launch
    from memfit.distributed.workers import relayed_to_launcher

    if args.nproc is not None:
        check_process_count(args.nproc, f"--nproc {args.nproc}")
        args.arguments.append(f"distributed.nproc={args.nproc}")
    # In a worker of `--nproc`, an error goes to the launcher, which prints it once.
    with relayed_to_launcher(args.debug) as outcome:
        config = _resolve_train_config(args)
        if args.print_config:
            sys.stdout.write(to_yaml(config))
            return 0
        if should_launch(config):  # this process starts the workers and waits for them
            return launch(config.distributed.nproc, _worker_arguments(args))
        from memfit.training.api import train

        result = train(config, resume=args.resume)
        if result.summary:  # rank 0's (the only one when not distributed)
            _print_summary(result.summary, result.output_dir)
    return outcome.exit_code


def _worker_arguments(args: argparse.Namespace) -> list[str]:
    """The ``memfit`` arguments each launched worker runs with (the same command)."""
    return ["train", *args.arguments, *(["--resume", args.resume] if args.resume else []),
            *(["--trust-code"] if args.trust_code else []), *(["--debug"] if args.debug else [])]


def _print_summary(summary: dict, run_dir: Path) -> None:
    print()
    first, final = summary["first_loss"], summary["final_loss"]
    if first is not None:
        print(f"training loss {first:.4f} -> {final:.4f} over {summary['steps']} steps "
              f"in {summary['train_seconds']:.1f} s on {summary['device']}")
    if summary.get("tokens_per_second") is not None:
        loss = summary.get("loss_tokens_per_second")
        print(f"throughput    {summary['tokens_per_second']:,.0f} tokens/s fed to the model "
              "(prompts too, padding not)" + (f"; {loss:,.0f} loss tokens/s (those the loss "
                                              "averages over)" if loss is not None else ""))
    if summary["eval_loss_before"] is not None:
        print(f"eval loss     {summary['eval_loss_before']:.4f} -> "
              f"{summary['eval_loss_after']:.4f}")
    elif summary["eval_loss_after"] is not None:  # train.eval_at_start=false
        print(f"eval loss     {summary['eval_loss_after']:.4f}")
    if summary.get("eval_accuracy") is not None:
        print(f"eval accuracy {summary['eval_accuracy']:.4f} (macro-F1 "
              f"{summary['eval_macro_f1']:.4f})")
    if summary.get("memory_not_measured"):
        print(f"peak memory   not measured: {summary['memory_not_measured']}")
    elif summary.get("memory_peak_bytes") is not None:
        parts = ", ".join(f"{name} {format_bytes(size)}"
                          for name, size in summary["memory_peak_by_category"].items())
        print(f"peak memory   {format_bytes(summary['memory_peak_bytes'])} ({parts})")
        if summary.get("memory_host_peak_bytes"):
            print(f"host memory   {format_bytes(summary['memory_host_peak_bytes'])} at most, "
                  "offloaded (not in the peak above)")
    print(f"run folder    {run_dir}/")
    for name, what in [
        ("config.yaml", "the resolved configuration"),
        ("metrics.jsonl", "one JSON object per logged step"),
        ("tensorboard/", f"events: tensorboard --logdir {run_dir}"),
        ("checkpoints/", f"resumable state: memfit train --resume {run_dir}"),
        ("memory.png", "memory by category over the steps"),
        ("adapters.txt", "which modules got adapters, and what trains"),
        (Path(summary["exported"]).name + "/", "the trained weights"),
        ("summary.json", "this summary"),
    ]:
        if (run_dir / name.rstrip("/")).exists():
            print(f"  {name:<15} {what}")


def _command_merge(args: argparse.Namespace) -> int:
    from memfit.merge import merge_run

    out = merge_run(args.run_dir, args.out, force=args.force, trust_code=args.trust_code)
    print(f"merged model  {out}/")
    return 0


def _command_generate(args: argparse.Namespace) -> int:
    from memfit.generate import answer, check_decoding, open_answerer
    from memfit.models.generation import Decoding

    decoding = Decoding(args.max_new_tokens, args.temperature, args.top_p, args.seed)
    check_decoding(decoding)  # before the (slow) model
    answerer = open_answerer(args.path, trust_code=args.trust_code, data_format=args.format)
    answer(answerer, args.prompt, decoding,
           on_text=lambda text: print(text, end="", flush=True))
    print()
    return 0


def _command_predict(args: argparse.Namespace) -> int:
    import json

    from memfit.predict import predictions, write_predictions

    if args.output is None:
        for record in predictions(args.run_dir, args.file, trust_code=args.trust_code):
            print(json.dumps(record), flush=True)
        return 0
    rows = write_predictions(args.run_dir, args.file, args.output, trust_code=args.trust_code)
    print(f"predictions   {rows} rows -> {args.output}")
    return 0


def _command_plan(args: argparse.Namespace) -> int:
    import json

    from memfit.config.devices import DATASHEETS
    from memfit.plan.planner import default_budget, load_plan_config, plan
    from memfit.plan.report import format_plan

    config_path, overrides = _split_arguments(args.arguments)
    config = load_plan_config(config_path, overrides)
    if args.max_length:
        from memfit.plan.longest import longest_fit
        from memfit.plan.report import format_longest

        if args.devices not in (None, 1):
            raise ConfigError("--max-length plans one device; drop --devices")
        device = "cuda" if args.device in DATASHEETS else args.device
        budget = default_budget(args.device) if args.budget is None else args.budget
        if budget is None:
            raise ConfigError("--max-length needs --budget (e.g. --budget 24GiB): there is no "
                              "GPU here to take it from")
        longest = longest_fit(config, budget, device=device)
        print(json.dumps(longest.to_json(), indent=2) if args.json
              else format_longest(longest, config))
        return 0
    from memfit.training.fit import example_batch

    result = plan(config, args.budget, device=args.device, example_batch=example_batch(config),
                  devices=args.devices, prefer=args.prefer, any_method=args.any_method)
    if result.calibrated:
        _say(f"memfit: {result.calibrated}")
    print(json.dumps(result.to_json(), indent=2) if args.json else format_plan(result, config))
    return 0


def _command_bench(args: argparse.Namespace) -> int:
    from memfit.bench import run_bench

    result = run_bench(args.suite, args.model, args.out, args.steps, args.cases,
                       on_progress=lambda line: print(f"memfit bench: {line}", file=sys.stderr))
    print(result.markdown)
    print(f"written to    {result.out}/ (bench.md, results.json, memory.png, loss.png, "
          f"memory_over_steps.png, runs/, logs/) in {result.wall_seconds / 60:.1f} min")
    if result.failed:
        print(f"memfit bench: {len(result.failed)} case(s) failed: {', '.join(result.failed)}",
              file=sys.stderr)
        return 1
    return 0


def _command_report(args: argparse.Namespace) -> int:
    from memfit.report import write_report

    print(f"report        {write_report(args.run_dir, args.out)}")
    return 0


def _command_env(args: argparse.Namespace) -> int:
    from memfit.environment import calibrate, describe

    for name, value in describe():
        print(f"{name:<24} {value}")
    if args.calibrate:
        for name, value in calibrate():
            print(f"{name:<24} {value}")
    return 0


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
    from memfit.config.choices import TOKEN_FORMATS
    from memfit.config.devices import DATASHEETS
    from memfit.config.reference import help_text

    parser = argparse.ArgumentParser(prog="memfit", description=DESCRIPTION)
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = commands.add_parser(
        "train", help="fine-tune a model (no arguments: the built-in offline demo)",
        description="Fine-tune a model. Without CONFIG.yaml the built-in demo is the base "
                    "config; key=value overrides apply on top.",
        epilog=help_text(), formatter_class=argparse.RawDescriptionHelpFormatter,
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
                    "recommended when some strategy fits one device, FSDP2 (fsdp) otherwise.")
    plan.add_argument("arguments", nargs="*", metavar="[CONFIG.yaml] [key=value ...]")
    plan.add_argument("--budget",
                      help="device memory, e.g. 24GiB, 16GB, 8e9 (above 0, at most 1 EiB); "
                           "marks what fits and recommends one; default: the GPU's memory "
                           "where one is present (--device cuda), else every strategy's "
                           "bytes with no fits column")
    plan.add_argument("--device", default="cuda", metavar="DEVICE",
                      help="the device to plan for: cuda (default, also where no GPU is here: "
                           "the header then says it is assumed) adds the CUDA context and "
                           "allocator overhead; cpu plans for this machine, tensors only; or a "
                           "GPU that is not here, from its builtin profile: "
                           f"{', '.join(DATASHEETS)} (its memory is the default --budget). "
                           "Step times come from this "
                           "machine's calibration (memfit env --calibrate; made on first use) "
                           "or the builtin profile")
    plan.add_argument("--prefer", choices=("quality", "speed"), default="quality",
                      help="quality (default): the most preferred method that fits, at its "
                           "fastest mix; speed: the fastest strategy that fits among the "
                           "methods of the config's adapter.kind")
    plan.add_argument("--any-method", action="store_true",
                      help="with --prefer speed: the fastest strategy that fits, any method")
    plan.add_argument("--devices", type=int, metavar="N",
                      help="bytes per device of training as N processes, one device each: "
                           "every strategy under ddp (each holds the whole model) and under "
                           "fsdp (sharded); 1 to 1024; default: distributed.nproc")
    plan.add_argument("--max-length", action="store_true",
                      help="instead of the table: the longest data.max_length (up to the "
                           "model's context) that fits --budget on one device at the "
                           "configured micro-batch, and the strategy that reaches it")
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    _add_debug(plan)
    plan.set_defaults(handler=_command_plan)

    bench = commands.add_parser(
        "bench", help="memory, speed and quality of memfit's strategies and their peers",
        description="Run memfit's strategies and the peers (plain PyTorch, bitsandbytes, "
                    "PEFT, galore-torch, HF Trainer) on the same model, data and seed, each in "
                    "its own process; print a markdown table and write it with PNGs to --out.")
    bench.add_argument("--suite", default="all",
                       help="memory (3 steps, all measured), speed (20), quality (60) or all "
                            "(60); default all")
    bench.add_argument("--model", default="demo-base",
                       help="demo-base (default), tiny-llama, or llama-1b (CUDA only)")
    bench.add_argument("--out", default="bench-results", metavar="DIR",
                       help="folder for bench.md, results.json and the PNGs")
    bench.add_argument("--steps", type=int, help="optimizer steps per case (default: the suite's)")
    bench.add_argument("--cases", metavar="NAMES",
                       help="a group (all, memfit, peers, gpu-check) or comma-separated case "
                            "names; default all")
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
                     help="also measure this machine's device for the planner's step times "
                          "(matmul per dtype, memory bandwidth, host link, cost per op; a few "
                          "seconds) and keep it in the user's cache folder")
    _add_debug(env)
    env.set_defaults(handler=_command_env)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """memfit's warnings as users read them: one line, no source location (``--debug``
    keeps it); another library's (transformers' notes, PEFT's deprecations, torch's
    advice to its own callers) is not something a memfit user can act on: dropped."""
    if issubclass(category, MemfitWarning):
        _say(f"memfit: warning: {message}")


@contextlib.contextmanager
def _quiet_libraries():
    """Within, only memfit speaks: other libraries' warnings are dropped and their logging
    below ERROR is off (transformers' "use_cache=True is incompatible with gradient
    checkpointing", ...); their errors still show. Restored on return: main may run
    in-process (tests, notebooks)."""
    disabled = logging.root.manager.disable
    # An in-process caller recording warnings (catch_warnings(record=True), pytest.warns)
    # records memfit's too.
    record = warnings._showwarnmsg_impl  # noqa: SLF001
    recording = getattr(record, "__module__", None) != "warnings"

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        _show_warning(message, category, filename, lineno, file, line)
        if recording and issubclass(category, MemfitWarning):
            record(warnings.WarningMessage(message, category, filename, lineno, file, line))

    with warnings.catch_warnings():  # restores warnings.showwarning too
        warnings.showwarning = show
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(disabled)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # Positionals after an option (`train --nproc 2 a=1 b=2`, `train cfg.yaml --nproc 2 x=1`)
    # come back unparsed: they continue the command's [CONFIG.yaml] [key=value ...].
    args, rest = parser.parse_known_args(argv)
    if rest and (not isinstance(getattr(args, "arguments", None), list)
                 or any(argument.startswith("-") for argument in rest)):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if rest:
        args.arguments.extend(rest)
    if args.command is None:
        parser.print_help()
        return 2
    # transformers' per-file loading bars would interleave with memfit's own output.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if args.debug:
        return _run(args)
    with _quiet_libraries():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    """The command, with expected failures as one line and their exit status."""
    try:
        return args.handler(args)
    except MemfitError as error:
        if isinstance(error, Stopped):  # a requested stop, not a failure
            _say(f"memfit: {error}")
            return error.exit_code
        if args.debug:
            raise
        # One line, whatever a value quoted in the message holds (a newline in a path).
        _say("memfit: error: " + str(error).replace("\r", "\\r").replace("\n", "\\n"))
        return error.exit_code
    except Exception as error:
        if args.debug:
            raise
        # The disk running out, or an installed library that fails to import: one line.
        line = DISK_FULL if is_disk_full(error) else broken_library(error)
        if line is None:
            raise
        _say(f"memfit: error: {line}")
        return 2
    except KeyboardInterrupt:
        _say("memfit: interrupted")
        return 130


def _say(line: str) -> None:
    """``line`` on stderr in ONE write: torchrun starts workers unbuffered (python -u), where
    print's separate write of the newline lets another rank's line land in between."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
