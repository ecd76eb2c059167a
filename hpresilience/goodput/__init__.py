"""The goodput ledger: where a job's wall time went, computed from the wrapper's decision records; written by the
wrapper (ledgerfile.py), read by root for `hpresilience job`/`goodput` (jobs.py, through ledgerread.py) and
exported by the controller (ledgermetrics.py)."""
