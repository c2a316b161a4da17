"""gs.explain against the tensor's own stride(), storage_offset(), is_contiguous() and
untyped_storage().data_ptr(), for views, transposes, slices and contiguous() copies."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET

import pytest
import torch
from rich.console import Console

import gradscope as gs
from gradscope.errors import ExplainInputError


def _base() -> torch.Tensor:
    # storage values equal storage positions, so a view's values say where it reads
    return torch.arange(12.0).reshape(3, 4)


# name -> (make the tensor from the base, does it share the base's storage?)
CASES = {
    "base": (lambda t: t, True),
    "view": (lambda t: t.view(4, 3), True),
    "transpose": (lambda t: t.T, True),
    "slice": (lambda t: t[1:, 2:], True),
    "step_slice": (lambda t: t[:, ::2], True),
    "select": (lambda t: t[1], True),
    "expand": (lambda t: t[:1].expand(3, 4), True),
    "unsqueeze": (lambda t: t.unsqueeze(0), True),
    "transpose_contiguous": (lambda t: t.T.contiguous(), False),
    "contiguous_of_contiguous": (lambda t: t.contiguous(), True),  # returns self
    "clone": (lambda t: t.clone(), False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_metadata_matches_the_tensor(name):
    base = _base()
    make, shares = CASES[name]
    t = make(base)
    e = gs.explain(t, base)
    assert e.shape == tuple(t.shape)
    assert e.stride == t.stride()
    assert e.storage_offset == t.storage_offset()
    assert e.is_contiguous == t.is_contiguous()
    assert e.data_ptr == t.untyped_storage().data_ptr()
    assert (e.data_ptr == base.untyped_storage().data_ptr()) == shares
    assert e.shares_storage_with == ([0] if shares else [])
    assert e.storage_nbytes == t.untyped_storage().nbytes()
    assert e.storage_numel == t.untyped_storage().nbytes() // t.element_size()
    assert e.is_view == t._is_view()


@pytest.mark.parametrize("name", list(CASES))
def test_every_index_maps_to_the_storage_element_it_reads(name):
    make, shares = CASES[name]
    t = make(_base())
    e = gs.explain(t)
    storage = torch.empty(0).set_(t.untyped_storage(), 0, (e.storage_numel,), (1,))
    assert len(e.mapping) == t.numel()
    for idx, pos in e.mapping:
        assert t[idx].item() == storage[pos].item()
        if shares:  # values of the base equal their storage positions
            assert t[idx].item() == pos
    assert e.storage_values == storage.tolist()


def test_transpose_of_3x4_is_the_course_picture():
    t = _base()
    e = gs.explain(t.T, t)
    assert (e.shape, e.stride, e.is_contiguous) == ((4, 3), (1, 4), False)
    assert [pos for _, pos in e.mapping][:4] == [0, 4, 8, 1]
    copy = gs.explain(t.T.contiguous(), t)
    assert (copy.stride, copy.is_contiguous, copy.shares_storage_with) == ((3, 1), True, [])


def test_several_others_and_autograd_fields():
    x = torch.randn(4, 3, requires_grad=True)
    y = x * 2
    v = y[1:]
    other = torch.zeros(2)
    e = gs.explain(v, x, y, other)
    assert e.shares_storage_with == [1]
    assert e.grad_fn == type(v.grad_fn).__name__ == "SliceBackward0"
    assert (e.is_leaf, e.requires_grad) == (v.is_leaf, v.requires_grad) == (False, True)
    leaf = gs.explain(x)
    assert (leaf.grad_fn, leaf.is_leaf, leaf.requires_grad) == (None, True, True)


def test_version_counter_follows_in_place_changes():
    t = torch.zeros(3)
    before = gs.explain(t).version
    t.add_(1)
    t[0] = 5
    assert gs.explain(t).version == t._version == before + 2


def _text(renderable, width=120) -> str:
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_rich_rendering_shows_table_and_mapping():
    t = _base()
    text = _text(gs.explain(t[1:, 2:], t))
    assert "storage_offset" in text and "│ 6 " in text.replace("  ", " ")
    assert "shares this storage" in text
    assert "[0,0]" in text and "[1,1]" in text
    big = _text(gs.explain(torch.zeros(100, 100)))
    assert "picture not drawn" in big


def test_save_writes_svg_with_one_box_per_storage_and_view_element(tmp_path):
    t = _base()
    e = gs.explain(t.T, t)
    path = e.save(tmp_path / "t.svg")
    root = ET.parse(path).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{ns}svg"
    rects = root.findall(f"{ns}rect")
    assert len(rects) == 1 + 12 + 12  # background, storage elements, view elements
    assert len(root.findall(f"{ns}line")) == 12
    texts = [x.text for x in root.findall(f"{ns}text")]
    assert "-> 4" in texts and "[0,1]" in texts
    with pytest.raises(gs.FormatError, match=r"\.svg"):
        e.save(tmp_path / "t.png")


def test_bad_inputs_raise_gradscope_errors():
    with pytest.raises(ExplainInputError, match="expects a torch.Tensor"):
        gs.explain([1, 2, 3])
    with pytest.raises(ExplainInputError, match="to_dense"):
        gs.explain(torch.eye(3).to_sparse())
    assert issubclass(ExplainInputError, gs.GradscopeError)
