"""The one GPU discovery: which devices CUDA_VISIBLE_DEVICES leaves this process, read the same way
by the run queue (placement) and the machine checks (counts)."""

from __future__ import annotations

import os

import pytest

from workbench.machine import NVIDIA_GPUS_DIR, check_fits_machine, visible_gpu_count, visible_gpus
from workbench.recipe import Recipe, RecipeError


@pytest.mark.parametrize("value, indices", [
    ("0,2", [0, 2]),
    ("2,0", [2, 0]),  # its order: the first named is the run's cuda:0
    (" 1 , 3 ", [1, 3]),
    ("7", [7]),  # taken as given: the driver's files may be absent (WSL2, some containers)
    ("", []),  # hides every GPU (what the local launcher sets for CPU runs)
    ("-1", []),
    ("0,-1", [0]),
    ("GPU-8a1f2b3c-0d4e-5f60-7182-93a4b5c6d7e8", []),  # UUID forms are not indices
    ("MIG-8a1f2b3c-0d4e-5f60-7182-93a4b5c6d7e8,1", []),  # a UUID list: its index-free entries end at "1"
    # CUDA reads up to the first entry that is not an index (torch.cuda._parse_visible_devices agrees):
    ("0,,1", [0]),
    ("0,2,-1,1", [0, 2]),
    ("-1,0", []),
    ("1gpu2,3", [1, 3]),  # strtoul: the leading digits
    ("0,GPU-8a1f2b3c,1", [0]),
    ("1,0,1", []),  # a device named twice hides every device
])
def test_cuda_visible_devices_names_the_visible_gpus(monkeypatch, value, indices):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert visible_gpus() == indices
    assert visible_gpus(torch_on_rocm=True) == indices  # the queue's reading is the same one


def test_without_cuda_visible_devices_the_driver_lists_the_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    driver = len(os.listdir(NVIDIA_GPUS_DIR)) if NVIDIA_GPUS_DIR.is_dir() else 0
    assert visible_gpus() == list(range(driver))


def test_the_machine_check_counts_the_visible_gpus(monkeypatch):
    """--processes is at most max(CPUs, GPUs): the GPUs are the ones visible_gpus names."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    check_fits_machine(Recipe(), 4, cpus=1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(RecipeError, match=r"--processes=4: at most 1 on this machine \(1 CPUs, 0 GPUs\)"):
        check_fits_machine(Recipe(), 4, cpus=1)


def test_a_steps_prompts_must_divide_among_the_processes_before_anything_is_written(monkeypatch):
    """sampling.prompts_per_step=4 over 3 processes: refused by the machine check (which runs
    before the run directory is claimed), naming the field, the value and the rule."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    with pytest.raises(RecipeError, match=r"sampling.prompts_per_step=4: must divide among the 3 processes"):
        check_fits_machine(Recipe(), 3, cpus=1)
    check_fits_machine(Recipe(), 1, world=2, cpus=1)  # WORLD_SIZE=2 under accelerate launch: 4 divides


@pytest.mark.parametrize("value, count", [("0,2", 2), ("", 0), ("-1", 0), ("MIG-8a1f2b3c-0d4e,1", 1),
                                          ("GPU-8a1f2b3c-0d4e,GPU-11aa22bb-33cc", 2),
                                          ("GPU-8a1f2b3c-0d4e,GPU-8a1f2b3c-0d4e", 0), ("0,2,-1,1", 2)])
def test_the_machine_checks_count_devices_named_by_uuid_too(monkeypatch, value, count):
    """A MIG slice or a scheduler's UUID list is a GPU to the run: the checks count it (the queue,
    which places runs by index, does not use it)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert visible_gpu_count() == count
