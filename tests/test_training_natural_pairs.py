"""training/verifier_natural.py reads the committed natural pairs (bench/data/natural_pairs/) from any working
directory: the move of training code out of bench/ had left its data path pointing at training/data, so
`python -m training.train_verifier` failed before training anything."""

from collections import Counter

import pytest

from training.verifier_natural import SOURCES, natural_pairs


def test_every_source_loads_with_both_labels_and_a_grouped_split() -> None:
    pairs = natural_pairs(0)
    by_source = Counter(p.source for p in pairs)
    assert set(by_source) == set(SOURCES), by_source
    assert by_source["comqa"] > 1000 and by_source["ambigqa"] > 300 and by_source["hand_natural"] > 50
    assert {p.label for p in pairs if p.source == "comqa"} == {0, 1}
    assert {p.split for p in pairs} == {"train", "calib"}


@pytest.mark.parametrize("held", SOURCES)
def test_a_held_out_source_goes_wholly_to_heldout(held: str) -> None:
    pairs = natural_pairs(0, held)
    assert {p.split for p in pairs if p.source == held} == {"heldout"}
    assert "heldout" not in {p.split for p in pairs if p.source != held}
