"""Jobs on the JobManager: validation, the ExecutionGraph, scheduling, restarts (pure core)."""
