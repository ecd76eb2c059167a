"""Talking to Slurm: the only code that runs Slurm commands or parses their output."""
