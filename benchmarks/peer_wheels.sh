#!/bin/bash
# The wheels of the JAX MoE peer (benchmarks/peer_grug.py): Levanter's Grug MoE and what its
# grug modules import, all pure Python, for an offline Python 3.12 GPU machine.
#   bash benchmarks/peer_wheels.sh                  # download into ./.whl_peer (needs PyPI)
#   bash benchmarks/peer_wheels.sh --install DIR    # install ./.whl_peer into DIR, offline
# Then PYTHONPATH=DIR:$PYTHONPATH python3 benchmarks/peer_grug.py. A device call carries
# .whl_peer beside .whl (../shared/tools/gpu_wheels.sh); .whl_peer/ goes into
# .git/info/exclude as .whl/ does. Everything is installed with --no-deps: marin-levanter pins
# jax>=0.9.2,<0.11 and the trainer's dependencies, which the grug MoE modules do not import.
# jax-triton is for sonic's Triton combine; it needs the triton package, a dependency of torch's
# CUDA wheels.
# $WHEELS_PEER names another folder than ./.whl_peer.
set -eu
cd "$(dirname "$0")/.."   # the checkout's root; a device machine's copy has no .git
dir=${WHEELS_PEER:-.whl_peer}
if [ "${1:-}" = --install ]; then
  target=${2:?usage: peer_wheels.sh --install DIR}
  if ! compgen -G "$dir/*.whl" > /dev/null; then
    echo "no wheels in $dir: run bash benchmarks/peer_wheels.sh first" >&2; exit 1
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$target" "$dir"/*.whl
  exit
fi
[ ! -d .git ] || grep -qx '/.whl_peer/' .git/info/exclude 2>/dev/null \
    || echo '/.whl_peer/' >> .git/info/exclude
mkdir -p "$dir"
plat="--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  --platform manylinux_2_28_x86_64"
# The versions peer_grug.py was written against: levanter/grug/grug_moe.py's moe_mlp and
# haliax/nn/ragged_dot.py as read in these wheels.
pkgs="marin-levanter==0.2.20.dev202606180959 marin-haliax==0.2.20.dev202606180959
  equinox==0.13.8 jaxtyping==0.3.11 wadler-lindig==0.1.8 aqtp==0.9.0 jax-triton==0.3.1"
for p in $pkgs; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp $plat -d "$dir" "$p" 2>&1 | grep -v '^WARNING' || true
done
ls "$dir"; du -sh "$dir"
