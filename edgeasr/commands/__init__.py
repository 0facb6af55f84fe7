"""The `edgeasr` sub-commands: each module has `register(subparsers)` and its handler."""
