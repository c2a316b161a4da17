"""A timm ConvNeXt (the smallest, convnext_atto), random weights (pretrained=False), one 64x64
image."""
import timm
import torch

model = timm.create_model("convnext_atto", pretrained=False, num_classes=10)
example_input = torch.randn(1, 3, 64, 64)


def loss_fn(output):
    return torch.nn.functional.cross_entropy(output, torch.tensor([2]))
