"""Small helpers shared by every layer (errors, byte sizes, atomic writes)."""
