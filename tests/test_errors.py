"""errors: a command's warnings as 'warning: ...' lines, not absl's log format; the user error
inside the wrappers of config_flags and absl."""

import logging

from absl import logging as absl_logging

from tst_jax import errors


def test_a_warning_is_one_plain_line_and_still_reaches_other_handlers(capsys, caplog):
  absl_handler = absl_logging.get_absl_handler()
  log = logging.getLogger("tst_jax")
  record = log.makeRecord("tst_jax", logging.WARNING, "setup.py", 72,
                          "no eval_bag_loss in phase %s", ("tst",), None)
  assert absl_handler.filter(record)            # before: absl's handler would print it
  try:
    errors.plain_warnings()
    errors.plain_warnings()                     # once: a second call adds nothing
    with caplog.at_level(logging.WARNING, logger="tst_jax"):
      log.warning("no eval_bag_loss in phase %s:\n  too few   windows", "tst")
      log.info("not a warning")
    assert capsys.readouterr().err == "warning: no eval_bag_loss in phase tst: too few windows\n"
    assert "no eval_bag_loss in phase tst" in caplog.text   # a test's handler still sees it
    assert not absl_handler.filter(record)      # absl's handler leaves it to the plain line
    other = logging.LogRecord("orbax", logging.WARNING, "x.py", 1, "theirs", (), None)
    assert absl_handler.filter(other)           # other libraries' lines are absl's as before
  finally:
    for handler in [h for h in log.handlers if isinstance(h, errors._PlainWarnings)]:  # pylint: disable=protected-access
      log.removeHandler(handler)
    absl_handler.removeFilter(errors._not_plain)   # pylint: disable=protected-access


def test_the_user_error_inside_the_wrappers_is_found():
  """config_flags re-raises a config file's error as a TypeError, absl wraps that again."""
  inner = errors.ConfigError("--config", "configs/demo.py: unknown arm 'bogus'")
  try:
    try:
      try:
        raise inner
      except ValueError as e:
        raise TypeError("Error whilst parsing config file") from e
    except TypeError as e:
      raise RuntimeError("flag --config=configs/demo.py:bogus") from e
  except RuntimeError as outer:
    assert errors.user_error_in(outer) is inner
  assert errors.user_error_in(RuntimeError("a bug")) is None


def test_the_chain_walk_takes_the_first_match_and_ends_on_a_loop():
  """`e` itself first, then what it was raised from before what it was raised during."""
  context, cause = KeyError("context"), OSError("cause")
  outer = RuntimeError("outer")
  outer.__context__, outer.__cause__ = context, cause
  assert errors.in_chain(outer, lambda e: True) is outer
  assert errors.in_chain(outer, lambda e: isinstance(e, OSError)) is cause
  assert errors.in_chain(outer, lambda e: isinstance(e, KeyError)) is None   # behind the cause
  outer.__cause__ = None
  assert errors.in_chain(outer, lambda e: isinstance(e, KeyError)) is context
  assert errors.in_chain(None, lambda e: True) is None
  first, second = ValueError("first"), ValueError("second")
  first.__cause__, second.__cause__ = second, first     # a loop: the walk must end
  asked = []
  assert errors.in_chain(first, lambda e: asked.append(e) and False) is None
  assert asked == [first, second]
