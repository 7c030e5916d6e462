"""A compact Swin-V2 (written for StitchCUDA's tests, KernelBench format): shifted windows by torch.roll, an
attention mask buffer, cosine attention with a clamped learnt scale, a relative position bias from an MLP picked
by an int64 index buffer, stochastic depth drawn in the forward (training mode), patch merging."""

import math
import torch
import torch.nn as nn
import torch.nn.functional as F


def drop_path(x, drop_prob=0.0, training=False):
    if drop_prob == 0.0 or not training:
        return x
    keep = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    r = keep + torch.rand(shape, dtype=x.dtype, device=x.device)
    r.floor_()
    return x.div(keep) * r


class DropPath(nn.Module):
    def __init__(self, p=None):
        super().__init__()
        self.p = p

    def forward(self, x):
        return drop_path(x, self.p, self.training)


def window_partition(x, ws):
    B, H, W, C = x.shape
    x = x.view(B, H // ws, ws, W // ws, ws, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws, ws, C)


def window_reverse(windows, ws, H, W):
    B = int(windows.shape[0] / (H * W / ws / ws))
    x = windows.view(B, H // ws, W // ws, ws, ws, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)


class WindowAttention(nn.Module):
    def __init__(self, dim, ws, heads):
        super().__init__()
        self.dim, self.ws, self.heads = dim, ws, heads
        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones((heads, 1, 1))), requires_grad=True)
        self.cpb_mlp = nn.Sequential(
            nn.Linear(2, 16, bias=True), nn.ReLU(inplace=True), nn.Linear(16, heads, bias=False)
        )
        h = torch.arange(-(ws - 1), ws, dtype=torch.float32)
        table = torch.stack(torch.meshgrid([h, h], indexing="ij")).permute(1, 2, 0).contiguous().unsqueeze(0)
        table = table / (ws - 1) * 8
        table = torch.sign(table) * torch.log2(torch.abs(table) + 1.0) / math.log2(8)
        self.register_buffer("relative_coords_table", table)
        coords = torch.flatten(
            torch.stack(torch.meshgrid([torch.arange(ws), torch.arange(ws)], indexing="ij")), 1
        )
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
        rel[:, :, 0] += ws - 1
        rel[:, :, 1] += ws - 1
        rel[:, :, 0] *= 2 * ws - 1
        self.register_buffer("relative_position_index", rel.sum(-1))
        self.qkv = nn.Linear(dim, dim * 3, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(dim))
        self.v_bias = nn.Parameter(torch.zeros(dim))
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv_bias = torch.cat((self.q_bias, torch.zeros_like(self.v_bias, requires_grad=False), self.v_bias))
        qkv = F.linear(input=x, weight=self.qkv.weight, bias=qkv_bias)
        qkv = qkv.reshape(B_, N, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        logit_scale = torch.clamp(
            self.logit_scale.to(x.device), max=torch.log(torch.tensor(1.0 / 0.01, device=x.device))
        ).exp()
        attn = attn * logit_scale
        table = self.cpb_mlp(self.relative_coords_table).view(-1, self.heads)
        bias = table[self.relative_position_index.view(-1)].view(self.ws * self.ws, self.ws * self.ws, -1)
        bias = 16 * torch.sigmoid(bias.permute(2, 0, 1).contiguous())
        attn = attn + bias.unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, self.heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.heads, N, N)
        attn = self.attn_drop(self.softmax(attn))
        x = (attn @ v).transpose(1, 2).reshape(B_, N, C)
        return self.proj_drop(self.proj(x))


class Block(nn.Module):
    def __init__(self, dim, res, heads, ws, shift, dp):
        super().__init__()
        self.res, self.ws, self.shift = res, ws, shift
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, ws, heads)
        self.drop_path = DropPath(dp) if dp > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 2 * dim), nn.GELU(), nn.Dropout(0.0), nn.Linear(2 * dim, dim), nn.Dropout(0.0)
        )
        if shift > 0:
            H, W = res
            img = torch.zeros((1, H, W, 1))
            cnt = 0
            for h in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                for w in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                    img[:, h, w, :] = cnt
                    cnt += 1
            mw = window_partition(img, ws).view(-1, ws * ws)
            am = mw.unsqueeze(1) - mw.unsqueeze(2)
            am = am.masked_fill(am != 0, float(-100.0)).masked_fill(am == 0, float(0.0))
        else:
            am = None
        self.register_buffer("attn_mask", am)

    def forward(self, x):
        H, W = self.res
        B, L, C = x.shape
        shortcut = x
        x = x.view(B, H, W, C)
        if self.shift > 0:
            x = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
        xw = window_partition(x, self.ws).view(-1, self.ws * self.ws, C)
        aw = self.attn(xw, mask=self.attn_mask).view(-1, self.ws, self.ws, C)
        x = window_reverse(aw, self.ws, H, W)
        if self.shift > 0:
            x = torch.roll(x, shifts=(self.shift, self.shift), dims=(1, 2))
        x = x.view(B, H * W, C)
        x = shortcut + self.drop_path(self.norm1(x))
        return x + self.drop_path(self.norm2(self.mlp(x)))


class PatchMerging(nn.Module):
    def __init__(self, res, dim):
        super().__init__()
        self.res = res
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(2 * dim)

    def forward(self, x):
        H, W = self.res
        B, L, C = x.shape
        x = x.view(B, H, W, C)
        x = torch.cat(
            [x[:, 0::2, 0::2, :], x[:, 1::2, 0::2, :], x[:, 0::2, 1::2, :], x[:, 1::2, 1::2, :]], -1
        )
        return self.norm(self.reduction(x.view(B, -1, 4 * C)))


class Model(nn.Module):
    def __init__(self, img=16, patch=2, dim=16, heads=2, ws=4, classes=10):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        self.pnorm = nn.LayerNorm(dim)
        r = img // patch
        self.blocks = nn.ModuleList(
            [Block(dim, (r, r), heads, ws, 0, 0.1), Block(dim, (r, r), heads, ws, ws // 2, 0.1)]
        )
        self.merge = PatchMerging((r, r), dim)
        self.norm = nn.LayerNorm(2 * dim)
        self.avgpool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(2 * dim, classes)

    def forward(self, x):
        x = self.pnorm(self.proj(x).flatten(2).transpose(1, 2))
        for b in self.blocks:
            x = b(x)
        x = self.norm(self.merge(x))
        x = torch.flatten(self.avgpool(x.transpose(1, 2)), 1)
        return self.head(x)


def get_inputs():
    return [torch.rand(2, 3, 16, 16)]


def get_init_inputs():
    return []
