"""training/'s rebuild check: the shipped cascade confidence is rebuilt from the committed live record and
matches routing/models/cascade_confidence.npz number for number (the router and the verifier take minutes
and data outside the repository: `python -m training.check router|verifier`, training/README.md)."""

from training.check import main


def test_the_cascade_confidence_rebuilds_to_the_shipped_file() -> None:
    result = main(["cascade", "--no-write"])["cascade"]
    assert result["matches"], result
    assert not result["missing"] and all(a["equal"] for a in result["arrays"].values())
