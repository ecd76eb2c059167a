"""The watches over a running step: each is a Detector (base.py) that returns a Verdict with its evidence,
registered by name in DETECTORS; the engines they read (log rules, hang clock, silence, stragglers, node
notices) live beside them."""
