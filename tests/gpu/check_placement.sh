#!/usr/bin/env bash
# GPU check of trident's placement planner (docs/placement.md): read this machine's live
# `nvidia-smi topo -m`, parse it, and run `trident plan` on a spec for the GPUs found;
# where MIG is enabled, check that nvidia-smi's MIG profiles and slices match trident's
# tables. Read-only: it never changes MIG mode or creates/destroys instances.
# Usage: tests/gpu/check_placement.sh [WORKDIR]    (needs nvidia-smi; ~10 s)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
TRIDENT=${TRIDENT:-.venv/bin/trident}
WORK=${1:-$(mktemp -d)}
mkdir -p "$WORK"

command -v nvidia-smi >/dev/null || { echo "FAIL: no nvidia-smi: this check needs a GPU"; exit 2; }
nvidia-smi --query-gpu=index,name,memory.total,mig.mode.current --format=csv,noheader \
  | tee "$WORK/gpus.csv"
nvidia-smi topo -m | tee "$WORK/topo.txt"
nvidia-smi -L > "$WORK/list.txt"
nvidia-smi mig -lgip > "$WORK/lgip.txt" 2>&1 || true    # fail harmlessly without MIG
nvidia-smi mig -lgipp > "$WORK/lgipp.txt" 2>&1 || true

"$PYTHON" - "$WORK" <<'PY'
import csv, re, sys
from pathlib import Path

import yaml

from builder.plan import gpus

from builder.plan import topology
sys.path.insert(0, "python_backends")
from trident_common import devices

work = Path(sys.argv[1])
rows = list(csv.reader((work / "gpus.csv").read_text().splitlines(), skipinitialspace=True))
name, memory = rows[0][1], float(rows[0][2].split()[0])
gpu = gpus.gpu_type_for(name, memory)
if gpu is None:
    sys.exit(f"FAIL: trident has no GPU type for {name!r} ({memory} MiB)")
print(f"OK: {name} ({memory:.0f} MiB) is {gpu.name}")
topo = topology.parse_topology((work / "topo.txt").read_text(), "nvidia-smi topo -m")
assert topo.count == len(rows), f"topology has {topo.count} GPUs, nvidia-smi lists {len(rows)}"
for size in (2, 4, 8):
    print(f"OK: best TP group of {size}:", topology.best_group(topo, range(topo.count), size))
# Every MIG profile nvidia-smi offers must be in trident's table, with its count and
# its placements ({starts}:size from -lgipp, joined to names by profile ID).
offered = re.findall(r"MIG (\S+)\s+(\d+)\s+(\d+)/(\d+)", (work / "lgip.txt").read_text())
placements = {int(pid): (tuple(int(x) for x in starts.split(",")), int(size))
              for pid, starts, size in re.findall(
                  r"Profile ID\s+(\d+) Placements?\s*:\s*\{([\d,]+)\}:(\d+)",
                  (work / "lgipp.txt").read_text())}
for profile, pid, _free, total in offered:
    ours = gpu.mig_profile(profile)
    assert ours is not None, f"nvidia-smi offers {profile}, trident's table lacks it"
    assert ours.max_count == int(total), f"{profile}: nvidia-smi {total}, trident {ours.max_count}"
    if int(pid) in placements:
        assert placements[int(pid)] == (ours.starts, ours.memory_slices), \
            f"{profile}: nvidia-smi places {placements[int(pid)]}, trident {ours.starts}"
print(f"OK: {len(offered)} MIG profile row(s) and {len(placements)} placement row(s) "
      "from nvidia-smi match trident's table")
slices = devices.mig_devices((work / "list.txt").read_text())
for (ordinal, profile), uuids in sorted(slices.items()):
    print(f"OK: GPU{ordinal} has {len(uuids)} × {profile}; first resolves to",
          devices.resolve(f"mig:{ordinal}:{profile}:0", lambda: (work / "list.txt").read_text()))
spec = {"name": "gpu-check", "hardware": {"gpu": gpu.name, "count": topo.count,
                                          "topology": str(work / "topo.txt")},
        "models": [{"name": "small", "engine": "vllm", "instances": 1,
                    "model": "meta-llama/Meta-Llama-3-8B-Instruct",
                    "engine_args": {"max_num_seqs": 8, "max_model_len": 4096}}]}
(work / "spec.yaml").write_text(yaml.safe_dump(spec))
(work / "gpu_type.txt").write_text(gpu.name)
biggest = max(gpu.mig_profiles, key=lambda p: p.compute_slices)
smallest = gpu.mig_profiles[0]
(work / "legal.txt").write_text(f"{smallest.name}={smallest.max_count}")
(work / "illegal.txt").write_text(f"{biggest.name}=1,{smallest.name}=1")
PY

"$TRIDENT" plan --spec "$WORK/spec.yaml"
GPU_TYPE=$(cat "$WORK/gpu_type.txt")
"$TRIDENT" mig check --gpu "$GPU_TYPE" --profiles "$(cat "$WORK/legal.txt")"
if "$TRIDENT" mig check --gpu "$GPU_TYPE" --profiles "$(cat "$WORK/illegal.txt")"; then
  echo "FAIL: an over-full MIG layout was accepted"; exit 1
fi
echo "PASS: placement check (files in $WORK)"
