"""Studies: questions answered once (alternatives compared, a study per round), kept with their results.

Nothing in the product, bench/ or tests/ imports them; they may import bench/'s helpers. Results go to
studies/results/ (RESULTS); studies/README.md holds the narrative.
"""

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def write_json(name: str, payload: Any) -> Path:
    """studies/results/<name>.json, as bench.lib.harness.write_json writes bench/results/."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2))
    return path
