"""A torchvision ResNet-18 compiled with torch.compile (aot_eager backend), random weights, one
64x64 image (at 32x32 the last batch norm, in train mode, sees one value per channel and
fails): the CLI expands the compiled region into its aten ops."""
import torch
import torchvision

model = torch.compile(torchvision.models.resnet18(weights=None, num_classes=10),
                      backend="aot_eager")
example_input = torch.randn(1, 3, 64, 64)


def loss_fn(output):
    return output.square().mean()
