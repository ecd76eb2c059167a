"""Srun --auto-resume (log rules, restart policy, spares)."""
