"""A ResNet stage in training mode: module-level block class with a class attribute, a downsampling shortcut
built in a helper method, batch norm with batch statistics."""

import os

import torch
from torch import nn

LARGE = os.environ.get("STITCHCUDA_SIZE", "small") == "large"
N, C_IN, C_OUT, HW = (32, 64, 128, 56) if LARGE else (2, 4, 8, 10)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_channels, out_channels, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels * self.expansion, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class Model(nn.Module):
    width = 2  # blocks per stage

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.in_channels = in_channels
        self.stage = self._make_stage(BasicBlock, out_channels, self.width, stride=2)

    def _make_stage(self, block, out_channels, blocks, stride):
        downsample = None
        if stride != 1 or self.in_channels != out_channels * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.in_channels, out_channels * block.expansion, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels * block.expansion),
            )
        layers = [block(self.in_channels, out_channels, stride, downsample)]
        self.in_channels = out_channels * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.in_channels, out_channels))
        return nn.Sequential(*layers)

    def forward(self, x):
        return self.stage(x)


def get_inputs():
    return [torch.randn(N, C_IN, HW, HW)]


def get_init_inputs():
    return [C_IN, C_OUT]
