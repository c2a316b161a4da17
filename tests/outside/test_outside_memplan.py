"""Checkpoint plans on outside models (torchvision, timm): predicted against the profiler's
measurement, with segments of sibling modules where the models chain them (a ``Sequential``
stem, a torchvision ``features`` stack). Runs on the leg with torchvision (and timm)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchvision", reason="the outside-model tests need torchvision "
                    "(scripts/test.sh installs it on the torch 2.14 leg)")

import gradscope as gs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def mobilenet():
    import torchvision

    return torchvision.models.mobilenet_v3_small(weights=None, num_classes=10)


def convnext():
    timm = pytest.importorskip("timm")
    return timm.create_model("convnext_atto", pretrained=False, num_classes=10)


def vgg():
    import torchvision

    return torchvision.models.vgg11(weights=None, num_classes=10)


@pytest.mark.parametrize("make", [mobilenet, convnext, vgg], ids=lambda f: f.__name__)
def test_plans_with_segments_measure_as_predicted(make):
    torch.manual_seed(0)
    model = make().eval()  # eval: no dropout, BatchNorm on its running statistics
    x = torch.randn(2, 3, 64, 64)

    def loss_fn(out):
        return out.pow(2).mean()

    rep = gs.activation_report(model, x, loss_fn=loss_fn)
    assert rep.segments()
    plan = gs.plan_checkpoints(model, x, budget="25%", loss_fn=loss_fn, report=rep)
    assert any(".." in unit for unit in plan.modules), plan.modules
    check = plan.verify(model, x, loss_fn=loss_fn)
    assert abs(check.measured - plan.predicted) <= 0.05 * check.measured
    assert check.measured <= plan.budget * 1.05
    assert abs(check.measured_baseline - rep.total) <= 0.05 * check.measured_baseline

    model.zero_grad(set_to_none=True)
    loss_fn(model(x)).backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    with plan.apply(model):
        loss_fn(model(x)).backward()
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, plain[n]), n
