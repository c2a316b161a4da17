"""torchvision ResNet-50, random weights (never downloaded), one 64x64 image."""
import torch
import torchvision

model = torchvision.models.resnet50(weights=None)
example_input = torch.randn(1, 3, 64, 64)


def loss_fn(output):
    return torch.nn.functional.cross_entropy(output, torch.tensor([3]))
