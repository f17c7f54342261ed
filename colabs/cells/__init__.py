"""What every notebook of colabs/ shares: the install cell and the TST_SMALL flag (CI)."""

INSTALL = '''
# Install tst-jax unless it is importable: from this checkout when the notebook runs inside
# one, else (e.g. on Colab) from a clone of TST_JAX_GIT, which you set to the repository URL.
import importlib.util, os, subprocess, sys

TST_JAX_GIT = os.environ.get("TST_JAX_GIT", "https://github.com/<org>/tst-jax")  # <- set me


def find_checkout(path=os.getcwd()):
  while not os.path.isfile(os.path.join(path, "pyproject.toml")) or \\
      not os.path.isdir(os.path.join(path, "tst_jax")):
    if os.path.dirname(path) == path:
      return None
    path = os.path.dirname(path)
  return path


REPO = find_checkout()
if REPO is None:
  if "<org>" in TST_JAX_GIT:
    raise RuntimeError("Not inside a tst-jax checkout: set TST_JAX_GIT to the repository URL")
  REPO = os.path.abspath("tst-jax")
  if not os.path.isdir(REPO):
    subprocess.check_call(["git", "clone", "--quiet", "--depth", "1", TST_JAX_GIT, REPO])
if importlib.util.find_spec("tst_jax") is None:
  subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", "-e", REPO])
  sys.path.insert(0, REPO)   # this kernel started before the editable install existed
print("tst-jax checkout:", REPO)
'''

SMALL_FLAG = 'TST_SMALL = os.environ.get("TST_SMALL", "0") == "1"   # CI: tiny sizes, seconds'
