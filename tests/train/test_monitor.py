"""The GPU utilisation monitor reads the GPU the run uses."""

import torch


def test_nvml_sees_the_gpu_cuda_calls_device_0_under_cuda_visible_devices(monkeypatch):
    from gpufeed.train.monitor import nvml_index

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert nvml_index(torch.device("cuda", 0)) == 2 and nvml_index(torch.device("cuda", 1)) == 3
