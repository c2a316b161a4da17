"""The doctor's call records (``recorder.CallRecords``): the nodes a call made are found by their
autograd sequence numbers, with no Python object made for a node in the forward; the records
stay bounded over a long loop, and keep the calls of nodes a live tensor still holds."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradscope as gs
from gradscope._torch import torchcompat
from gradscope.doctor import recorder
from gradscope.doctor.recorder import DOCTOR_KEY, CallRecords


def _inplace_after_save() -> gs.AutogradError:
    w = torch.randn(3, requires_grad=True)
    x = torch.randn(3)
    with pytest.raises(gs.AutogradError) as err:
        with gs.doctor():
            y = x * 2
            z = y * w  # saves y
            y += 1  # <- modified
            z.sum().backward()
    return err.value


def test_the_in_place_write_after_a_save_is_named_with_op_and_line() -> None:
    finding = _inplace_after_save().finding
    assert finding.kind == "inplace"
    assert finding.op == "add_" and finding.line == "test_doctor_records.py:24"
    saved = [s for s in finding.sites if s.role == "saved"]
    assert saved and saved[0].op == "mul" and saved[0].line == "test_doctor_records.py:23"


def test_the_same_finding_where_the_counter_is_read_with_a_probe_node(monkeypatch) -> None:
    """A torch without ``_get_sequence_nr``: a probe node reads the counter before and after
    each call (it takes a number itself, off the call's range)."""
    monkeypatch.setattr(recorder, "_next_seq", torchcompat._probe_sequence_nr)
    monkeypatch.setattr(recorder, "_PROBED", 1)
    finding = _inplace_after_save().finding
    assert (finding.op, finding.line) == ("add_", "test_doctor_records.py:24")
    assert "saved for backward by mul at test_doctor_records.py:23" in finding.message


def test_no_node_is_stamped_in_the_forward() -> None:
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with gs.doctor(net) as doc:
        out = net(torch.randn(2, 4)).sum()
        mode = doc.mode
        assert mode is not None and len(mode.records) == 3  # linear, relu, sum
        fn = out.grad_fn
        assert DOCTOR_KEY not in fn.metadata  # read back from the records instead
        rec = mode.node_record(fn)
        assert rec is not None and rec.op == "sum" and rec.site.line == \
            "test_doctor_records.py:50" and rec.iteration == 0
        out.backward()
    assert doc.findings == []


def test_records_find_by_range_and_trim_keeps_what_lives() -> None:
    records = CallRecords(limit=4)
    for i, start in enumerate((10, 12, 20, 21)):  # 12..13, 20, 21..22 (a gap: 14..19)
        records.add(start, start + (1 if start == 20 else 2), i, i // 2, "op", f"f.py:{i}",
                    None, True)
    assert records.find(11)[0] == 0 and records.find(13)[0] == 1
    assert records.find(15) is None and records.find(9) is None and records.find(23) is None
    records.trim(1, alive=[11])  # iteration 0's second call has no live node: dropped
    assert [records.find(s) is not None for s in (10, 12, 20, 21)] == [True, False, True, True]
    assert records.limit == 6


def test_records_stay_bounded_and_keep_a_kept_graph(monkeypatch) -> None:
    monkeypatch.setattr(recorder, "_RECORDS_KEPT", 64)
    torch.manual_seed(0)
    net = nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    with pytest.raises(gs.AutogradError) as err:
        with gs.doctor(net, optimizer=opt) as doc:
            kept = net(torch.randn(2, 4)).sum()  # its node's record outlives the trims
            kept.backward()
            for _ in range(100):
                loss = net(torch.randn(8, 4)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            assert doc.mode is not None and len(doc.mode.records) <= 128
            kept.backward()
    finding = err.value.finding
    assert finding.kind == "backward_twice"
    assert "(its root SumBackward0 was made by sum at test_doctor_records.py:81)" in \
        finding.message, finding.message
