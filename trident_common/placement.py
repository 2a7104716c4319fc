"""Which devices an engine model's instance (its own stub process) may use."""

from __future__ import annotations

import os
from typing import Any

from trident_common import devices
from trident_common.triton_io import model_parameters


def apply_device_placement(args: dict[str, Any]) -> None:
    """Bind this instance (its own stub process) to the devices the placement chose.

    `INSTANCE_DEVICES` is one entry per instance, ';'-separated; each entry is what
    CUDA_VISIBLE_DEVICES gets (GPU ordinals, or a MIG slice that devices.resolve turns
    into its UUID). The instance index is the
    last part of Triton's instance name (`<model>_<group>_<index>`)."""
    params = model_parameters(args)
    per_instance = params.get("INSTANCE_DEVICES")
    if per_instance:
        entries = per_instance.split(";")
        index = int(args.get("model_instance_name", "x_0").rsplit("_", 1)[-1])
        os.environ["CUDA_VISIBLE_DEVICES"] = devices.resolve(
            entries[index % len(entries)], devices.nvidia_smi_list
        )
    elif params.get("GPU_DEVICE_IDS"):
        os.environ["CUDA_VISIBLE_DEVICES"] = params["GPU_DEVICE_IDS"]
    elif args.get("model_instance_kind") == "GPU":
        os.environ["CUDA_VISIBLE_DEVICES"] = str(args.get("model_instance_device_id", "0"))
