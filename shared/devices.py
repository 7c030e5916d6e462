"""Resolves the device a job runs on ("auto" picks CUDA when a GPU is visible)."""

from __future__ import annotations

from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.shared.errors import InvalidRequest, Unavailable

NAMES = {"auto": jobs_pb2.DEVICE_AUTO, "cpu": jobs_pb2.DEVICE_CPU, "cuda": jobs_pb2.DEVICE_CUDA}


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def resolve(device: str | int) -> str:
    """'auto' | 'cpu' | 'cuda' (or the proto enum) -> 'cpu' | 'cuda'."""
    if isinstance(device, int):
        device = next((name for name, value in NAMES.items() if value == device), "auto")
    if device not in NAMES:
        raise InvalidRequest(f"unknown device {device!r}: choose auto, cpu or cuda")
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        raise Unavailable("device 'cuda' asked for, but no CUDA GPU is visible to this process")
    return device


def to_proto(device: str) -> jobs_pb2.Device.ValueType:
    return NAMES[device]
