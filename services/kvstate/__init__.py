"""Queryable state: the KvState registry (pure: ``registry`` and ``core``), publishing a
task's per-key results (``publish``, on the TaskManager side) and its read model."""
