"""A job's run directory: its name, its state, its lock, its checkpoint and the run's identity."""
