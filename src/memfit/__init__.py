"""memfit: fine-tune PyTorch models inside the GPU memory you actually have."""

__version__ = "0.1.0"
