"""Subcommands of the ``anpred`` CLI (see :mod:`anpred.cli`)."""
