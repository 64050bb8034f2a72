"""Subcommands of the ``gpufeed`` CLI, one module per group; see :mod:`gpufeed.cli`."""
