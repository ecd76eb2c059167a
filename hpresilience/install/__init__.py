"""`hpresilience install`: one node's install for its role, from a built wheel, idempotent."""
