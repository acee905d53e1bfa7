"""Measuring a run: memory meters, speed meters, loggers and plots."""
