"""What a verdict means (verdicts.py: a table), why an ended step ended (ending.py, classify.py), the restart budget
(policy.py) and where the next attempt runs (capacity.py)."""
