"""Training: assemble the techniques (build) and run the explicit loop (loop)."""
