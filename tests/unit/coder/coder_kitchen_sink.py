"""A reference exercising most of the synthesizer's lowerings at once (used by test_coder_coverage.py)."""

import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812 (the reference idiom under test)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(2, 4)
        self.inorm = nn.InstanceNorm2d(4, affine=True)
        self.ln = nn.LayerNorm(8)
        self.act = nn.LeakyReLU(0.2)
        self.bn = nn.BatchNorm2d(4)
        self.gap = nn.AdaptiveAvgPool2d(1)  # global pooling: a reduction over the feature map
        self.gmp = nn.AdaptiveMaxPool1d(1)
        self.amp = nn.AdaptiveMaxPool1d(5)
        self.ap3 = nn.AdaptiveAvgPool3d((2, 1, 3))
        self.triplet = nn.TripletMarginLoss(margin=0.7)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)
        self.eval()

    def forward(self, x, y):
        a = self.gn(x)
        b = self.inorm(x)
        c = torch.where(x > 0, x, 0.1 * x) + F.hardswish(y)
        d = torch.argmax(x, dim=1)
        e = torch.max(x, dim=-1)[0]
        f = torch.logsumexp(x, dim=2)
        g = x.var(dim=(2, 3), keepdim=True)
        h = F.avg_pool2d(self.act(x), 2, stride=2, padding=1, count_include_pad=False)
        i = F.adaptive_avg_pool2d(self.bn(x), (3, 3))
        j = self.ln(x).permute(0, 2, 1, 3).flatten(2)
        k, m = x.chunk(2, dim=1)
        n = F.softplus(k) * torch.sigmoid(m) - F.elu(k) / (1 + F.selu(m).abs())
        o = torch.sum(x, dim=0)
        p = torch.softmax(x, dim=1)
        q = F.mish(x).mean()
        r = torch.clamp(x, min=-0.5) ** 3 + torch.rsqrt(x.abs() + 1)
        s = F.gelu(x) * F.silu(x) + torch.tanh(x) * F.relu6(x)
        t = F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True)
        u = torch.log_softmax(x.view(x.size(0), -1), dim=-1)
        v = F.normalize(x, dim=1) + x.std(dim=-1, keepdim=True)
        w = self.gap(x) * 2.0 + self.gmp(x.flatten(2)).unsqueeze(-1)
        z = self.amp(x.flatten(2)) + self.ap3(x.unsqueeze(1)).flatten(2).sum(dim=-1, keepdim=True)
        zero = torch.tensor(0.25, device=x.device)  # a constant placed on the input's device
        aa = torch.min(x, zero) + torch.max(x, dim=1, keepdim=True).values
        bb = torch.min(x, dim=2).indices
        target = torch.tanh(x) * 2
        cc = F.smooth_l1_loss(x, target, beta=0.5) + F.huber_loss(x, target, reduction="sum", delta=0.8)
        dd = F.kl_div(torch.log_softmax(x, dim=-1), torch.softmax(x * 0.5, dim=-1), reduction="batchmean")
        ee = self.triplet(x, target, x * 0.3) + F.smooth_l1_loss(x, target, reduction="none")
        ff = torch.cat([x, torch.relu(x), x[:, :1]], dim=1) * 2
        gg = torch.stack([x, x * 2], dim=-1).amax(dim=-1) + torch.cat((y, y), 0)[3:11]
        return a, b, c, d, e, f, g, h, i, j, n, o, p, q, r, s, t, u, v, w, z, aa, bb, cc, dd, ee, ff, gg


def get_inputs():
    return [torch.randn(2, 4, 6, 8), torch.randn(8)]


def get_init_inputs():
    return []
