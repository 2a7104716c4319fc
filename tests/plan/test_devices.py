"""Device names on the live box: GPU product → table entry, MIG entry → slice UUID."""

from __future__ import annotations

import pytest

from builder.plan.gpus import gpu_type_for
from trident_common import devices

LISTING = """\
GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0c4e)
GPU 6: NVIDIA H100 80GB HBM3 (UUID: GPU-6a1f)
  MIG 3g.40gb     Device  0: (UUID: MIG-5d1c9c0e-aaaa)
  MIG 3g.40gb     Device  1: (UUID: MIG-77e0b2b1-bbbb)
  MIG 1g.10gb     Device  2: (UUID: MIG-0b9a1f00-cccc)
GPU 7: NVIDIA H100 80GB HBM3 (UUID: GPU-7b2e)
  MIG 3g.40gb     Device  0: (UUID: MIG-9999)
"""


@pytest.mark.parametrize(
    "name, mib, expected",
    [
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA H100 PCIe", 81559, "H100-PCIE-80GB"),
        ("NVIDIA H100 NVL", 95830, "H100-94GB"),
        ("NVIDIA H200", 143771, "H200-141GB"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", 81920, "A100-80GB"),
        ("NVIDIA A30", 24576, "A30-24GB"),
    ],
)
def test_gpu_type_for_nvidia_smi_names(name, mib, expected):
    assert gpu_type_for(name, mib).name == expected


def test_unknown_gpu_is_none():
    assert gpu_type_for("Tesla T4", 15360) is None


def test_mig_listing_and_resolution():
    assert devices.mig_devices(LISTING) == {
        (6, "3g.40gb"): ["MIG-5d1c9c0e-aaaa", "MIG-77e0b2b1-bbbb"],
        (6, "1g.10gb"): ["MIG-0b9a1f00-cccc"],
        (7, "3g.40gb"): ["MIG-9999"],
    }
    assert devices.resolve("mig:6:3g.40gb:1", lambda: LISTING) == "MIG-77e0b2b1-bbbb"
    assert devices.resolve("mig:7:3g.40gb:0", lambda: LISTING) == "MIG-9999"
    assert devices.resolve("0,1", lambda: pytest.fail("ordinals need no listing")) == "0,1"
    with pytest.raises(devices.DeviceError, match="GPU 6 has 2 3g.40gb MIG slice"):
        devices.resolve("mig:6:3g.40gb:2", lambda: LISTING)
    with pytest.raises(devices.DeviceError, match="expected mig:<gpu>:<profile>:<n>"):
        devices.resolve("mig:6:3g.40gb", lambda: LISTING)
