"""Save and resume the whole training state."""

from memfit.checkpoint.state import (
    TrainerState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)

__all__ = ["TrainerState", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]
