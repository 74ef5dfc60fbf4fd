"""The fake upstream of bench/semantic_cache_replay.py: tests/fakes.py's FakeUpstream, except that a chat
completion's answer is "intent-N: …", N read from a JSON file mapping each question text to its intent.

    python -m bench.semantic_cache_replay_upstream PORT ANSWERS.json
"""

import json
import sys
from pathlib import Path
from typing import Any

import uvicorn

from tests.fakes import FakeUpstream, _completion, _json, _last_text


class IntentUpstream(FakeUpstream):
    def __init__(self, intents: dict[str, int]) -> None:
        super().__init__("intent")
        self.intents = intents

    async def _answer(self, path: str, body: dict[str, Any], receive: Any, send: Any) -> None:
        text = _last_text(body)
        intent = self.intents.get(text, -1)
        answer = _completion(body, f"the answer of intent {intent}")
        answer["choices"][0]["message"]["content"] = f"intent-{intent}: the answer of intent {intent}"
        await _json(send, 200, answer)


def main() -> None:
    port, path = int(sys.argv[1]), Path(sys.argv[2])
    app = IntentUpstream(json.loads(path.read_text()))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", loop="uvloop", http="httptools")


if __name__ == "__main__":
    main()
