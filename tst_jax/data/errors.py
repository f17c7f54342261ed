"""DataError: input data that cannot be used as it is (a source, a store, a shard)."""


class DataError(ValueError):
  """Bad data, not a bug: the message names the file (and line) and says what to do.

  The trainer re-raises it as a ConfigError of `config.data.source`; the prepare command prints
  it as one line and exits with status 2. Everything written before it stays valid.
  """
