"""The `farm` command line: one module per noun."""
