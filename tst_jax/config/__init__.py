"""Planning and config: the typed spec of a run, its sections and defaults, the phase plan,
the outlook, and the config and plan records a workdir keeps."""
