"""Operator coordinators on the JobManager (FLIP-27): the framework, the source's split
enumerator, and the split assignment core shared with the seed ``RequestNextInputSplit``
protocol."""
