"""The click commands: thin layers that parse arguments, load the configuration once and call the package.

Top of the layer order (see docs/design.md): a command may import any part; no part imports a command.
"""
