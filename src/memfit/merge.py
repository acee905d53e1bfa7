"""``memfit merge RUN_DIR --out DIR``: the trained adapters folded into the base weights.

The merged model is built by ``training/trained_model.py`` (shared with ``memfit
generate`` and ``memfit predict``): the base rebuilt exactly as training saw it,
quantized layers dequantized to ``model.dtype`` (so the merged weights are
``dequant(W_q) + (alpha / r) B A``, the function the adapter model computed), PEFT's
``merge_and_unload`` folding the update in, and the base's buffers set to the values
training left them at.

Output: a normal Hugging Face folder (config + model.safetensors + tokenizer) for
transformers models and for a factory's ``model.export_module`` (the adapter was saved
relative to that submodule, and is merged into it alone), or ``model.safetensors``
holding a state dict (parameters and persistent buffers) that loads into the factory's
module with ``load_state_dict(strict=True)``.

A full fine-tune trained with distributed.strategy=fsdp is consolidated instead: its
newest sharded checkpoint becomes one normal model folder (finished or not).

A run folder may come from anyone: what merge cannot fold in faithfully is refused in one
line before anything is written (checkpoint/adapter_checks.py: non-finite, unmatched,
missing or misshapen adapter tensors, q,k,v parts (``adapter/parts.json``) outside their
module's rows, LoRA settings memfit does not write, damaged files),
and so is an ``--out`` that is a link, or is, holds or lies inside what the run reads
(its model.path, data, code) — replacing those would make a later ``--resume`` train on
the merged weights. Two merges into one ``--out`` at once: one writes, the other is
refused (``_claimed``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from memfit._utils.atomic import staged_folder
from memfit._utils.errors import ConfigError
from memfit._utils.folders import creation_problem
from memfit._utils.no_follow import link_message, open_no_follow
from memfit.checkpoint.export import save_model
from memfit.config import Config
from memfit.config.code_trust import code_references, module_file, refuse_untrusted_code
from memfit.training.trained_model import merged_model, run_config


def _places_of(config: Config) -> list[tuple[str, str]]:
    """``(key, path)`` for each file or folder the run reads when it resumes: its base, its
    data, and code files it names. A value that is no local path (a hub name) is included
    too: a folder created under that name would be read instead on the next resume."""
    places = [(key, value) for key, value in (("model.path", config.model.path),
                                              ("data.path", config.data.path),
                                              ("data.eval_path", config.data.eval_path))
              if value]
    for key, reference in code_references(config):
        found = module_file(reference.rpartition(":")[0])
        if found not in ("not found", "built in"):
            places.append((key, found))
    return places


def _check_out(run_dir: Path, config: Config, out: Path, force: bool) -> None:
    """Refuse an ``--out`` that would overwrite or sit inside what the user has: the run
    itself, what it reads (even with ``--force``: a resume would train on the merged
    weights), the current directory, a link, or a folder with content (unless
    ``--force``)."""
    if out.is_symlink():  # --force would replace the link, a plain write would follow it
        raise ConfigError(f"memfit merge --out {out}: {link_message(out)}")
    run, target, here = run_dir.resolve(), out.resolve(), Path.cwd().resolve()
    for name, place in (("the run folder", run), ("the current directory", here)):
        if target == place or place.is_relative_to(target):
            raise ConfigError(f"memfit merge --out {out}: that is or contains {name}; "
                              "choose a new folder")
    if target.is_relative_to(run):
        raise ConfigError(f"memfit merge --out {out}: that is inside the run folder {run_dir}; "
                          "choose a folder outside it")
    for key, value in _places_of(config):
        place = Path(value).resolve()
        if target == place or target.is_relative_to(place) or place.is_relative_to(target):
            raise ConfigError(f"memfit merge --out {out}: that is, holds or lies inside the "
                              f"run's {key}={value}, which a resume of the run reads (refused "
                              "even with --force); choose another folder")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"memfit merge --out {out}: that is a file; choose a new folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ConfigError(f"memfit merge --out {out}: that folder is not empty; choose a new "
                          "folder, or pass --force to replace its contents")
    problem = None if out.is_dir() else creation_problem(out)
    if problem is not None:
        raise ConfigError(f"memfit merge --out {out} cannot be created: {problem}")


def claim_path(out: Path) -> Path:
    """The file whose lock a merge into ``out`` holds while it writes: named after ``out``,
    or after its hash where that name would pass the 255 bytes a file name may have."""
    name = f".{out.name}.memfit-merge.lock"
    if len(os.fsencode(name)) > 255:
        name = f".{hashlib.sha256(os.fsencode(out.name)).hexdigest()[:16]}.memfit-merge.lock"
    return out.parent / name


@contextlib.contextmanager
def _claimed(out: Path) -> Iterator[None]:
    """Be the only merge writing ``out`` until the block ends, or refuse in one line.

    The claim is an exclusive ``flock`` on an empty file beside ``out``. It is opened with
    O_NOFOLLOW, so a link planted at that name is refused, never written through; nothing is
    ever written into it. The kernel drops a lock when its holder dies, so a file a killed
    merge left behind blocks nobody (and the next merge removes it). The holder removes the
    file before it lets go; another merge may have opened that file a moment earlier and get
    the lock once it is released, on a file no longer at that name, which guards nothing: so
    a lock counts only while the name still leads to the locked file (else it lost a race
    with a merge that has just written ``out``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = claim_path(out)
    busy = (f"memfit merge --out {out}: another memfit merge into that folder is running; "
            "let it finish, or choose another folder")
    try:
        handle = open_no_follow(path, os.O_RDWR | os.O_CREAT, 0o600)
    except ConfigError as error:  # a link, a FIFO, ... planted at that name
        raise ConfigError(f"memfit merge --out {out}: its lock file: {error}") from None
    except OSError as error:
        raise ConfigError(f"memfit merge --out {out}: cannot create its lock file {path} "
                          f"({error.strerror}); remove whatever is at that name") from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(busy) from None
        if not _names(path, handle):
            raise ConfigError(busy)
        try:
            yield
        finally:
            if _names(path, handle):
                path.unlink()
    finally:
        os.close(handle)


def _names(path: Path, handle: int) -> bool:
    """Whether ``path`` (not followed) is the open file ``handle``."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(handle)
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


def merge_run(run_dir: str | Path, out: str | Path, force: bool = False,
              trust_code: bool = False) -> Path:
    """Write the merged model of ``run_dir`` to ``out``: a new or empty folder, or with
    ``force`` a folder whose contents are replaced — only once the new model is complete
    (written beside it, then swapped in). ``trust_code``: import the code the run's config
    names (``--trust-code``). Every refusal comes before anything is written."""
    run_dir, out = Path(run_dir), Path(out)
    config = run_config(run_dir)
    refuse_untrusted_code(config, f"memfit merge {run_dir}: its config.yaml", trust_code)
    _check_out(run_dir, config, out, force)
    model, tokenizer, is_transformers = merged_model(run_dir, config)
    with _claimed(out):
        # Again: another merge may have written out while this one merged.
        _check_out(run_dir, config, out, force)
        with staged_folder(out) as folder:
            save_model(folder, model, tokenizer, save_pretrained=is_transformers)
    return out
