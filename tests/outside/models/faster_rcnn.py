"""torchvision Faster R-CNN (ResNet-50 FPN) in train mode: its output is the dict of losses.
Random weights (no backbone download), a small image (min_size 64) and few proposals and
sampled boxes, so that it runs in seconds; the graph's ops are those of the full-size model.
The model is built at import, outside the forward the CLI records."""
import torch
import torchvision

model = torchvision.models.detection.fasterrcnn_resnet50_fpn(
    weights=None, weights_backbone=None, num_classes=3, min_size=64, max_size=96,
    rpn_pre_nms_top_n_train=200, rpn_post_nms_top_n_train=100, rpn_batch_size_per_image=64,
    box_batch_size_per_image=32,
)
model.train()


def build():
    images = [torch.rand(3, 64, 80)]
    targets = [{"boxes": torch.tensor([[4.0, 6.0, 40.0, 50.0], [30.0, 10.0, 70.0, 60.0]]),
                "labels": torch.tensor([1, 2])}]
    return model, (images, targets)


def loss_fn(losses):
    return sum(losses.values())
