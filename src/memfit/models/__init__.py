"""Models: presets, loading from folders/presets/factories, tokenizers."""
