#!/usr/bin/env bash
# Pack what `python -m bench.gpu_rate` needs on a bare GPU machine (x86-64, no network, no
# Python 3.11, no trident dependencies) into .device/ (git-ignored, carried there beside the
# working tree; bench/device_gpu_rate.sh unpacks and runs it):
#   py311.tar.xz   the venv's base Python 3.11 (interpreter, libpython, stdlib without tests,
#                  GUI and build leftovers) and only the distributions that gpu_rate, the
#                  `trident openai` frontend and the served models (router, vLLM model on the
#                  AsyncLLM double) import: traced with strace on the direct/router/openai
#                  paths. No vllm, torch or transformers: the double stands in for vLLM.
#   triton.tar.xz  site-packages/{pytriton/tritonserver,nvidia_pytriton.libs} of the
#                  nvidia-pytriton wheel: tritonserver, the Python backend with the 3.11 stub
#                  in place, and only the shared libraries those need (ldd), where
#                  builder/serve/install.py looks for them (find_spec("pytriton")).
# Usage, from the repository root: bash bench/device_bundle.sh
set -euo pipefail
PY=${VENV:-.venv}/bin/python
BASE=$("$PY" -c 'import sys; print(sys.base_prefix)')
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
DISTS="numpy ml_dtypes tritonclient grpcio protobuf googleapis-common-protos python-rapidjson
  PyYAML Jinja2 MarkupSafe jsonschema jsonschema-specifications referencing rpds-py attrs
  httpx httpcore h11 anyio sniffio idna certifi fastapi starlette pydantic pydantic_core
  pydantic-extra-types typing_extensions typing-inspection annotated-types annotated-doc
  email-validator python-multipart uvicorn uvloop httptools websockets watchfiles click
  rich Pygments redis psutil filelock packaging
  opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions"
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p .device "$STAGE/py/bin" "$STAGE/py/lib" "$STAGE/triton"

# (a) the interpreter: python3.11 + libpython (RUNPATH points at pyenv: the device script sets
# LD_LIBRARY_PATH), the stdlib without test/, GUI, 2to3, ensurepip, the static libpython
# (config-3.11-*) and bytecode (compiled on the device), and none of pyenv's site-packages.
cp "$BASE/bin/python3.11" "$STAGE/py/bin/"
ln -s python3.11 "$STAGE/py/bin/python3"
ln -s python3.11 "$STAGE/py/bin/python"
cp -P "$BASE"/lib/libpython3*.so* "$STAGE/py/lib/"
tar -C "$BASE/lib" -c --exclude=__pycache__ --exclude='python3.11/site-packages' \
  --exclude='python3.11/test' --exclude='python3.11/idlelib' --exclude='python3.11/tkinter' \
  --exclude='python3.11/turtledemo' --exclude='python3.11/ensurepip' \
  --exclude='python3.11/lib2to3' \
  --exclude='python3.11/pydoc_data' --exclude='python3.11/config-3.11-*' \
  --exclude='*/lib-dynload/_tkinter*' --exclude='*/lib-dynload/_test*' \
  --exclude='*/lib-dynload/xxlimited*' --exclude='*/lib-dynload/_ctypes_test*' \
  python3.11 | tar -C "$STAGE/py/lib" -x
# (b) the distributions, file by file from their RECORD (dist-info kept: opentelemetry finds
# its context through entry points), without tests, bytecode and scripts outside site-packages
"$PY" - "$STAGE/py/lib/python3.11/site-packages" $DISTS <<'EOF'
import importlib.metadata as md, shutil, sys
from pathlib import Path
dest = Path(sys.argv[1])
for name in sys.argv[2:]:
    dist = md.distribution(name)
    for f in dist.files:
        if f.parts[0] == ".." or {"__pycache__", "tests"} & set(f.parts) or f.suffix == ".pyc":
            continue
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(dist.locate_file(f), dest / f)
EOF
# (c) the builtin models' config.json alone: the paced AsyncLLM double reads no weights, but
# the render resolves a builtin model to its folder (builder/engines/assets.py: a folder with a
# config.json is taken as built; building it needs torch, which the bundle leaves out)
MODELS=$("$PY" -c 'from builder.engines.assets import models_dir; print(models_dir())')
rm -rf .device/models
for config in "$MODELS"/*/config.json; do
  mkdir -p ".device/models/$(basename "$(dirname "$config")")"
  cp "$config" ".device/models/$(basename "$(dirname "$config")")/"
done
# debug symbols off the few unstripped libraries (libpython 23 -> 4 MB, uvloop, ml_dtypes)
# (only files with .debug_* sections: the auditwheel-patched ones are left as they are)
find "$STAGE/py" -name '*.so*' -type f | while read -r f; do
  if readelf -S "$f" | grep -q '\.debug_'; then strip --strip-debug "$f"; fi
done
strip --strip-debug "$STAGE/py/bin/python3.11"
tar -C "$STAGE" -cf - py | xz -9 -T0 > .device/py311.tar.xz

# (c) the server, laid out as site-packages holds it: its RUNPATHs name
# $ORIGIN/../../../[../]nvidia_pytriton.libs
T=$SITE/pytriton/tritonserver
mkdir -p "$STAGE/triton/pytriton/tritonserver/python_backend_stubs" \
  "$STAGE/triton/nvidia_pytriton.libs"
cp -a "$T/bin" "$T/caches" "$STAGE/triton/pytriton/tritonserver/"
mkdir -p "$STAGE/triton/pytriton/tritonserver/backends/python"
cp -a "$T"/backends/python/{libtriton_python.so,triton_python_backend_utils.py} \
  "$STAGE/triton/pytriton/tritonserver/backends/python/"
cp -a "$T/python_backend_stubs/3.11" "$STAGE/triton/pytriton/tritonserver/python_backend_stubs/"
cp -a "$T/python_backend_stubs/3.11/triton_python_backend_stub" \
  "$STAGE/triton/pytriton/tritonserver/backends/python/"
LD_LIBRARY_PATH="$BASE/lib" ldd "$T/bin/tritonserver" "$T"/backends/python/libtriton_python.so \
  "$T/python_backend_stubs/3.11/triton_python_backend_stub" "$T"/caches/local/*.so |
  grep -o '/[^ ]*nvidia_pytriton\.libs/[^ ]*' | sort -u |
  xargs -I{} cp {} "$STAGE/triton/nvidia_pytriton.libs/"
tar -C "$STAGE/triton" -cf - pytriton nvidia_pytriton.libs | xz -9 -T0 > .device/triton.tar.xz

ls -l .device/*.tar.xz
du -ch .device/*.tar.xz | tail -1
