"""torchvision ViT-B/16, random weights, built for 64x64 images (16 patches + the class token)."""
import torch
import torchvision

model = torchvision.models.vit_b_16(weights=None, image_size=64)
example_input = torch.randn(1, 3, 64, 64)


def loss_fn(output):
    return torch.nn.functional.cross_entropy(output, torch.tensor([7]))
