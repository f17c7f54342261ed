"""The run's record: readers and writers of its directory's files, the lock, appends, the
metrics and their sinks, the console and the step profile."""
