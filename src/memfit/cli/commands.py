"""The ``memfit`` commands' handlers: each reads its parsed arguments, calls the library and
prints what it did (parser.py wires them to their subcommands)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from memfit._utils.errors import ConfigError, MemfitError
from memfit._utils.sizes import format_bytes


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
    return _job_config(config_path, overrides)


def _job_config(config_path: str | None, overrides: list[str]):
    """A job as ``memfit train`` takes it: CONFIG.yaml and overrides, or without a file the
    built-in demo with the overrides on top."""
    from memfit.config.load import read_yaml
    from memfit.techniques.config_checks import load_config

    if config_path is None:
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
        # This process starts the workers and waits for them.
        if should_launch(config.distributed.nproc):
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

        device = "cuda" if args.device in DATASHEETS else args.device
        budget = default_budget(args.device) if args.budget is None else args.budget
        if budget is None:
            raise ConfigError("--max-length needs --budget (e.g. --budget 24GiB): there is no "
                              "GPU here to take it from")
        devices = config.distributed.nproc if args.devices is None else args.devices
        longest = longest_fit(config, budget, device=device, devices=devices)
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

    def progress(line: str) -> None:
        print(f"memfit bench: {line}", file=sys.stderr)

    job = [name for name, given in [("CONFIG.yaml", args.arguments),
                                    ("--strategies", args.strategies is not None),
                                    ("--top", args.top is not None),
                                    ("--budget", args.budget is not None)] if given]
    suite = [name for name in ("suite", "model", "cases") if getattr(args, name) is not None]
    if job:
        if suite:
            raise ConfigError(f"--{suite[0]} is the suite's; {job[0]} benches your own job "
                              "(give one or the other)")
        from memfit.bench.job import run_job_bench

        config_path, overrides = _split_arguments(args.arguments)
        label = " ".join(args.arguments) or "(the demo)"
        result = run_job_bench(_job_config(config_path, overrides), label, args.strategies,
                               args.top, args.steps, args.out, args.budget, progress)
    else:
        result = run_bench(args.suite or "all", args.model or "demo-base", args.out,
                           args.steps, args.cases, on_progress=progress)
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


def _say(line: str) -> None:
    """``line`` on stderr in ONE write: torchrun starts workers unbuffered (python -u), where
    print's separate write of the newline lets another rank's line land in between."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
