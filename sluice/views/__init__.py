"""Read-only views of the cluster and its jobs, folded from the log at any moment.

Each view is JSON data (dicts, lists, str, int, float, None) that the CLI renders
(`sluice inspect ...`, `--json`) and the web dashboard serves; ``history`` folds
the log up to an entry (time travel).
"""
