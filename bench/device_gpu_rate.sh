#!/usr/bin/env bash
# bench.gpu_rate on a bare GPU machine (no network, no Python 3.11): run from the repository
# root with .device/ (bench/device_bundle.sh) carried. Unpacks Python 3.11 under /tmp, the
# pytriton tritonserver into its site-packages (where builder/serve/install.py finds it), puts
# the repository on its sys.path (a .pth: what the editable install does here), then runs
# gpu_rate once per router instance count. Results: $OUT/inst<N>/gpu_rate.json (+ the server's
# and the frontend's logs), the console in $OUT/console.log.
# Overrides: GPU_RATE_POINTS, GPU_RATE_PATHS, GPU_RATE_INSTANCES (space-separated), PY311.
set -euo pipefail
: "${OUT:?set OUT to the folder whose files come back}"
POINTS=${GPU_RATE_POINTS:-64x100,256x50,256x100}
CHOSEN=${GPU_RATE_PATHS:-direct,router}
INSTANCES=${GPU_RATE_INSTANCES:-1 4}
PY=${PY311:-/tmp/trident-py311}
mkdir -p "$OUT"

main() {
  start=$SECONDS
  rm -rf "$PY" && mkdir -p "$PY"
  tar -C "$PY" --strip-components=1 -xJf .device/py311.tar.xz
  SITE=$PY/lib/python3.11/site-packages
  tar -C "$SITE" -xJf .device/triton.tar.xz
  echo "$PWD" > "$SITE/trident_repository.pth"
  # The interpreter's and the stub's libpython (their RUNPATH names the build machine's pyenv),
  # and the unpacked bin first: the Python backend's stub takes its Python from PATH.
  export PATH="$PY/bin:$PATH"
  export LD_LIBRARY_PATH="$PY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  unset PYTHONPATH PYTHONHOME VIRTUAL_ENV
  # the builtin models as bench/device_bundle.sh packed them (config.json alone: the double
  # reads no weights)
  export TRIDENT_HOME=/tmp/trident-home
  mkdir -p "$TRIDENT_HOME/models" && cp -r .device/models/. "$TRIDENT_HOME/models/"
  python3.11 -m compileall -q -j 0 "$PY/lib/python3.11" > /dev/null || true
  echo "unpacked in $((SECONDS - start)) s"

  echo "nproc: $(nproc)"
  df -h /dev/shm | tail -1  # the Python backend's shared memory
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  else
    echo "no nvidia-smi"
  fi
  python3.11 - << 'EOF'
import ssl, ctypes, lzma, bz2, zlib, hashlib, uuid, sys  # the system libraries they need
from builder.serve.install import find_tritonserver
print("python:", sys.executable, sys.version.split()[0])
print("tritonserver:", find_tritonserver().binary)
print("libpython:", next(l.split()[-1] for l in open("/proc/self/maps") if "libpython" in l))
EOF

  for n in $INSTANCES; do
    echo "== gpu_rate, router instances $n, paths $CHOSEN, points $POINTS"
    t=$SECONDS
    python3.11 -m bench.gpu_rate --no-refine --paths "$CHOSEN" --points "$POINTS" \
      --router-instances "$n" --out "$OUT/inst$n"
    echo "== router instances $n took $((SECONDS - t)) s"
  done
}
main 2>&1 | tee -a "$OUT/console.log"
