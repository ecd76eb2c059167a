"""Launching one attempt's step: its nodes and srun line (plan, srunargs), its output (stream), the runner that starts,
streams and stops it (runner), and what the wrapper does on the nodes around it (stepops)."""
