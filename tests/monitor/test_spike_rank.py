"""``spike_rank``: which rank a spiking step came from, by each rank's own loss against its
own recent ones (the gradients are reduced before they are measured). The two-process case
is ``test_first_rank.py``'s spike plant."""

from __future__ import annotations

import math

from gradscope.monitor.incident import Incident, spike_rank

CALM = [1.0, 1.1, 0.9, 1.0]


def test_the_rank_whose_loss_jumped_alone_is_named() -> None:
    rank, lines = spike_rank([1.05, 40.0], [CALM, CALM])
    assert rank == 1
    assert lines == [
        "rank 0: its loss was 1.05, 1.05x its median of the last 4 logged steps",
        "rank 1: its loss was 40, 40x its median of the last 4 logged steps",
    ]


def test_losses_that_jumped_together_name_no_rank() -> None:
    rank, lines = spike_rank([30.0, 40.0], [CALM, CALM])
    assert rank is None
    assert lines[-1].startswith("no rank's own loss jumped apart from the others'")


def test_a_small_jump_is_no_evidence() -> None:
    rank, _ = spike_rank([1.0, 1.8], [CALM, CALM])  # under LOSS_JUMP: the loss barely moved
    assert rank is None


def test_without_losses_or_history_no_rank_is_named_and_the_line_says_what_is_missing() -> None:
    rank, lines = spike_rank([None, None], [[], []])
    assert rank is None
    assert lines == ["rank 0: its loss was not observed (observe_loss)",
                     "rank 1: its loss was not observed (observe_loss)",
                     "which rank needs each rank's loss (observe_loss) over a few logged steps"]
    rank, lines = spike_rank([1.0, 50.0], [[1.0], [1.0]])
    assert rank is None
    assert lines[1] == "rank 1: its loss was 50 (1 earlier logged loss)"
    assert lines[-1] == "which rank needs a few earlier logged losses on each rank"


def test_negative_and_non_finite_losses_are_not_compared() -> None:
    rank, lines = spike_rank([-5.0, math.inf], [[-1.0, -1.2, -0.9], CALM])
    assert rank is None
    assert lines[0] == "rank 0: its loss was -5 (not comparable with its earlier ones)"
    assert lines[1] == "rank 1: its loss was inf (not comparable with its earlier ones)"


def test_the_spike_sentence_names_the_rank() -> None:
    inc = Incident(step=7, kind="spike", signal="grad_norm", ratio=120.0, rank=1,
                   ranks=["rank 0: ...", "rank 1: ..."])
    assert inc.spike_sentence() == "spike x120 at step 7 (the gradient norm) from rank 1"
    assert Incident.from_dict(inc.to_dict()) == inc
