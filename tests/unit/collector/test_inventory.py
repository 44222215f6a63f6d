"""Machine inventory for the resource report (COL-11), and every reader against this machine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from healthplane.contracts import wire
from healthplane_collector.inventory import Inventory, InventoryError, inventory_of
from healthplane_collector.mounts import READ_ONLY_BY_NATURE
from healthplane_collector.probe import read_edac, read_inventory, read_ioerr, read_mounts
from tests.unit.collector.memory_files import MemoryFiles

BOOT_ID = "38ca8589-451b-4ee2-9a36-5514fd96590b"
CPUINFO = "".join(
    f"processor\t: {n}\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon\n\n" for n in range(4)
)
MEMINFO = "MemTotal:       24683656 kB\nMemFree:        24179484 kB\n"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def machine(root: Path, hostname: str = "gpu-node-07\n") -> Path:
    write(root / "etc/hostname", hostname)
    write(root / "proc/sys/kernel/hostname", "kernel-name\n")
    write(root / "proc/cpuinfo", CPUINFO)
    write(root / "sys/devices/system/cpu/online", "0-3\n")
    write(root / "proc/meminfo", MEMINFO)
    write(root / "proc/sys/kernel/random/boot_id", BOOT_ID + "\n")
    (root / "sys/bus/pci/devices").mkdir(parents=True)
    return root


def pci_device(root: Path, bus_id: str, vendor: str, pci_class: str) -> Path:
    path = root / "sys/bus/pci/devices" / bus_id
    write(path / "vendor", f"{vendor}\n")
    write(path / "class", f"{pci_class}\n")
    write(path / "device", "0x2330\n")
    return path


def test_host_facts_COL_11(tmp_path: Path) -> None:
    inventory = read_inventory(machine(tmp_path))

    assert inventory == Inventory(
        hostname="gpu-node-07",
        cores=4,
        memory_bytes=24683656 * 1024,
        boot_id=BOOT_ID,
        gpus=(),
    )


def test_hostname_skips_comments_and_falls_back_to_the_kernel_COL_11(tmp_path: Path) -> None:
    machine(tmp_path, hostname="# set by cloud-init\n\n  node-a  \n")
    assert read_inventory(tmp_path).hostname == "node-a"

    (tmp_path / "etc/hostname").unlink()
    assert read_inventory(tmp_path).hostname == "kernel-name"


@pytest.mark.parametrize(("online", "cores"), [("0\n", 1), ("0-63\n", 64), ("0-3,5,7-8\n", 7)])
def test_cores_fall_back_to_the_online_range_COL_11(
    tmp_path: Path, online: str, cores: int
) -> None:
    machine(tmp_path)
    write(tmp_path / "proc/cpuinfo", "vendor_id : IBM/S390\n")  # no processor lines
    write(tmp_path / "sys/devices/system/cpu/online", online)

    assert read_inventory(tmp_path).cores == cores


def test_cores_fall_back_when_cpuinfo_is_missing_COL_11(tmp_path: Path) -> None:
    machine(tmp_path)
    (tmp_path / "proc/cpuinfo").unlink()
    write(tmp_path / "sys/devices/system/cpu/online", "0-7\n")

    assert read_inventory(tmp_path).cores == 8


def test_gpus_in_bus_order_indexed_per_vendor_COL_3_COL_11(tmp_path: Path) -> None:
    machine(tmp_path)
    pci_device(tmp_path, "0000:c1:00.0", "0x1002", "0x038000")  # AMD MI250X: display other
    pci_device(tmp_path, "0000:bb:00.0", "0x10de", "0x030200")  # NVIDIA H100: 3D controller
    pci_device(tmp_path, "0000:1b:00.0", "0x10de", "0x030200")
    pci_device(tmp_path, "0000:1b:00.1", "0x10de", "0x040300")  # HDMI audio function
    pci_device(tmp_path, "0000:05:00.0", "0x10de", "0x068000")  # NVSwitch bridge
    pci_device(tmp_path, "0000:03:00.0", "0x1002", "0x030000")  # AMD VGA
    pci_device(tmp_path, "0001:0a:00.0", "0x1002", "0x120000")  # AMD MI300X accelerator
    pci_device(tmp_path, "0000:00:00.0", "0x8086", "0x060000")  # host bridge
    pci_device(tmp_path, "0000:02:00.0", "0x1af4", "0x030000")  # virtio-gpu: not a vendor we know

    gpus = read_inventory(tmp_path).gpus

    assert gpus == (
        wire.ResourceDevice(kind="gpu", vendor="amd", index=0, pci_bus_id="0000:03:00.0"),
        wire.ResourceDevice(kind="gpu", vendor="nvidia", index=0, pci_bus_id="0000:1b:00.0"),
        wire.ResourceDevice(kind="gpu", vendor="nvidia", index=1, pci_bus_id="0000:bb:00.0"),
        wire.ResourceDevice(kind="gpu", vendor="amd", index=1, pci_bus_id="0000:c1:00.0"),
        wire.ResourceDevice(kind="gpu", vendor="amd", index=2, pci_bus_id="0001:0a:00.0"),
    )


def test_sriov_virtual_functions_are_not_gpus_of_this_node_COL_11(tmp_path: Path) -> None:
    machine(tmp_path)
    physical = pci_device(tmp_path, "0000:3b:00.0", "0x10de", "0x030200")
    virtual = pci_device(tmp_path, "0000:3b:00.4", "0x10de", "0x030200")
    (virtual / "physfn").symlink_to(physical)

    assert [g.pci_bus_id for g in read_inventory(tmp_path).gpus] == ["0000:3b:00.0"]


def test_no_pci_tree_means_no_gpus(tmp_path: Path) -> None:
    machine(tmp_path)
    (tmp_path / "sys/bus/pci/devices").rmdir()

    assert read_inventory(tmp_path).gpus == ()


def test_missing_boot_id_is_none(tmp_path: Path) -> None:
    machine(tmp_path)
    (tmp_path / "proc/sys/kernel/random/boot_id").unlink()

    assert read_inventory(tmp_path).boot_id is None


@pytest.mark.parametrize(
    ("relative", "text"),
    [
        ("proc/meminfo", "MemFree: 1 kB\n"),
        ("proc/meminfo", "MemTotal: lots kB\n"),
        ("proc/sys/kernel/random/boot_id", "not-a-uuid\n"),
        ("sys/bus/pci/devices/0000:3b:00.0/vendor", "nvidia\n"),
        ("sys/bus/pci/devices/0000:3b:00.0/class", "\n"),
    ],
)
def test_garbage_raises_naming_the_file_COL_12(tmp_path: Path, relative: str, text: str) -> None:
    machine(tmp_path)
    pci_device(tmp_path, "0000:3b:00.0", "0x10de", "0x030200")
    write(tmp_path / relative, text)

    with pytest.raises(InventoryError, match=re.escape(str(tmp_path / relative))):
        read_inventory(tmp_path)


def test_no_cpu_count_anywhere_raises_COL_12(tmp_path: Path) -> None:
    machine(tmp_path)
    (tmp_path / "proc/cpuinfo").unlink()
    write(tmp_path / "sys/devices/system/cpu/online", "zero to three\n")

    with pytest.raises(InventoryError, match="cpu/online"):
        read_inventory(tmp_path)


def test_pci_file_that_vanished_raises_COL_12(tmp_path: Path) -> None:
    machine(tmp_path)
    gpu = pci_device(tmp_path, "0000:3b:00.0", "0x10de", "0x030200")
    (gpu / "class").unlink()
    (gpu / "class").symlink_to(tmp_path / "gone")

    with pytest.raises(InventoryError, match="vanished"):
        read_inventory(tmp_path)


def test_every_reader_is_honest_on_this_machine_COL_4_COL_11_ING_7() -> None:
    """The real root: statuses must match what the machine has, never "ok" over nothing.

    Only what must hold is asserted (this sandbox has no EDAC driver; a real node may)."""
    root = Path("/")

    edac = read_edac(root)
    controllers = [
        p for p in Path("/sys/devices/system/edac/mc").glob("mc*") if re.fullmatch(r"mc\d+", p.name)
    ]
    if not controllers:
        assert edac.status == "unavailable", edac
        assert edac.reason
    assert edac.status != "ok" or edac.controllers
    assert edac.status == "ok" or (edac.reason and not edac.controllers)

    ioerr = read_ioerr(root)
    if not list(Path("/sys/block").glob("*/device/ioerr_cnt")):
        assert ioerr.status == "unavailable", ioerr
    assert ioerr.status != "ok" or ioerr.devices
    assert ioerr.status == "ok" or ioerr.reason

    mounts = read_mounts(root)
    assert mounts.status == "ok", mounts  # /proc/mounts is readable wherever tests run
    for mount in mounts.read_only:
        assert mount.device.startswith("/dev/") and mount.fs_type not in READ_ONLY_BY_NATURE

    inventory = read_inventory(root)
    assert inventory.hostname
    assert inventory.cores >= 1
    assert inventory.memory_bytes > 0
    assert inventory.boot_id is None or re.fullmatch(r"[0-9a-f-]{36}", inventory.boot_id)
    assert [g.index for g in inventory.gpus if g.vendor == "nvidia"] == list(
        range(sum(g.vendor == "nvidia" for g in inventory.gpus))
    )


HOST = {
    "proc/sys/kernel/hostname": "node-b\n",
    "sys/devices/system/cpu/online": "0-1\n",
    "proc/meminfo": "MemTotal: 2 kB\n",
    "sys/bus/pci/devices/0000:3b:00.0/vendor": "0x10de\n",
    "sys/bus/pci/devices/0000:3b:00.0/class": "0x030200\n",
}


def test_inventory_of_a_tree() -> None:
    """The parser alone, on a tree held in memory: the kernel's hostname, the online CPU
    range and no boot id stand in for what is missing."""
    assert inventory_of(MemoryFiles(HOST)) == Inventory(
        hostname="node-b", cores=2, memory_bytes=2048, boot_id=None,
        gpus=(wire.ResourceDevice(kind="gpu", vendor="nvidia", index=0, pci_bus_id="0000:3b:00.0"),),
    )


def test_inventory_of_a_tree_without_memory_names_the_file() -> None:
    tree = {key: text for key, text in HOST.items() if key != "proc/meminfo"}
    with pytest.raises(InventoryError, match="/host/proc/meminfo: missing"):
        inventory_of(MemoryFiles(tree))
