"""Save and resume the whole training state."""

from memfit.checkpoint.folders import newest_intact_checkpoint, remove_stale_staging
from memfit.checkpoint.state import (
    TrainerState,
    load_checkpoint,
    save_checkpoint,
)

__all__ = ["TrainerState", "load_checkpoint", "newest_intact_checkpoint",
           "remove_stale_staging", "save_checkpoint"]
