"""The node agent (schedule, guard rails, metrics address)."""
