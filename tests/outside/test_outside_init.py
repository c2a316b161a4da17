"""Outside models built *inside* ``record_forward(check_finite=True)``, from parameters whose
memory starts as all NaN (``torch.empty`` poisoned, the worst uninitialised memory can hold),
then run: no finding. Before the recorder knew that ``nn.init`` (torchvision's and timm's
``kaiming_uniform_``, Hugging Face's ``normal_``) writes over a parameter without reading it,
each of these was a false "a parameter already held nan", at random in real use."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torchvision", reason="the outside-model tests need torchvision "
                    "(the torch 2.14.1 leg of scripts/test.sh installs it)")

import torch  # noqa: E402
from conftest import nan_empty  # noqa: E402

import gradscope as gs  # noqa: E402

MODELS = Path(__file__).resolve().parent / "models"
#: one intra-op thread: ViT-B/16's 86 M parameters are filled by parallel ops, and beside a
#: second test worker torch's spinning pool made this 1.5 s test take 10-11 s
pytestmark = pytest.mark.usefixtures("one_thread")

#: model file -> the import it needs beyond torchvision
FILES = {"resnet50": None, "vit_b_16": None, "hf_llama": "transformers", "timm_convnext": "timm"}


@pytest.mark.parametrize("name", sorted(FILES))
def test_an_outside_model_built_in_the_recorder_from_nan_memory_is_no_finding(
    monkeypatch, name: str
) -> None:
    if FILES[name]:
        pytest.importorskip(FILES[name])
    spec = importlib.util.spec_from_file_location(f"outside_{name}", MODELS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setattr(torch, "empty", nan_empty)
    with gs.record_forward(check_finite=True) as fw:
        spec.loader.exec_module(module)
        if hasattr(module, "build"):
            model, given = module.build()
            out = model(**given) if isinstance(given, dict) else model(given)
        else:
            model = module.model
            out = model(module.example_input)
    assert fw.first_nonfinite is None, fw.first_nonfinite
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert out is not None
