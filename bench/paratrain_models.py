"""paratrain's built-in MLP and CNN in PyTorch, for the bench scripts that run
the same work under PyTorch (ddp_pytorch.py, zero_pytorch.py,
pytorch_ddp_cpu.py). Same layers, names and shapes as paratrain/models/;
PyTorch's default initialization (the scripts compare speed and memory)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Mlp(nn.Module):
    """paratrain/models/mlp.cpp: fc0..fcN (Linear), ReLU between, input flattened."""

    def __init__(self, hidden=(1024, 1024), in_features=784, out_features=10):
        super().__init__()
        widths = [in_features, *hidden, out_features]
        self.in_features = in_features
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, x):
        h = x.reshape(x.size(0), self.in_features)
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i + 1 < len(self.layers):
                h = torch.relu(h)
        return h


class Cnn(nn.Module):
    """paratrain/models/cnn.cpp: per channel count conv3x3 (padding 1)-ReLU-maxpool2,
    then fc0 (flattened maps -> hidden)-ReLU, fc1 (hidden -> 10)."""

    def __init__(self, channels=(32, 64), hidden=128, in_channels=1, image_size=28, num_classes=10):
        super().__init__()
        self.shape = (in_channels, image_size, image_size)
        convs, c, side = [], in_channels, image_size
        for out in channels:
            convs.append(nn.Conv2d(c, out, 3, padding=1))
            c, side = out, side // 2
        self.convs = nn.ModuleList(convs)
        self.flat = c * side * side
        self.fc0 = nn.Linear(self.flat, hidden)
        self.fc1 = nn.Linear(hidden, num_classes)

    def forward(self, x):
        h = x.reshape(x.size(0), *self.shape)
        for conv in self.convs:
            h = F.max_pool2d(torch.relu(conv(h)), 2)
        h = torch.relu(self.fc0(h.reshape(h.size(0), self.flat)))
        return self.fc1(h)
