# Sourced by gpu.sh and sweep_common.sh: a bare GPU machine lacks tokamax, grain,
# ml_collections... that ../shared/tools/gpu_wheels.sh downloads into ./.whl (carried with the
# call). install_wheels installs them into /tmp/site once per machine (nothing when tokamax
# imports already or .whl holds no wheel), stubs xprof as that script says, and puts /tmp/site
# on PYTHONPATH. A command before it (e.g. `timeout 45`) bounds the pip step. $WHEELS names
# another folder than ./.whl (the tests: an empty one, whatever the checkout holds).
WHEELS=${WHEELS:-.whl}
install_wheels() {
  compgen -G "$WHEELS/*.whl" > /dev/null || return 0
  if ! python3 -c 'import tokamax' 2> /dev/null; then
    "$@" python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site "$WHEELS"/*.whl || return
    mkdir -p /tmp/site/xprof/cli && touch /tmp/site/xprof/__init__.py \
        /tmp/site/xprof/cli/__init__.py
    echo 'get_kernel_stats_tool = None' > /tmp/site/xprof/cli/tools.py   # tokamax imports it
  fi
  [ -d /tmp/site ] && export PYTHONPATH=/tmp/site:$PYTHONPATH
  return 0
}
