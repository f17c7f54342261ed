"""Planning and config: the typed spec of a run, its sections and defaults, the phase plan,
the fit check and the outlook."""
