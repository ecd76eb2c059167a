"""Test and demo tooling shipped with the package: the embedded local Slurm cluster (devcluster), fake
hardware nodes laid out like real ones (fakenode), and a scripted command runner for client-level tests.

Above the runtime parts in the layer order: it may use slurm/ and health/, and no runtime part imports it.
"""
