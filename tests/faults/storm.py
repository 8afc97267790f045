"""A provider storm, the same on every run: each call attempt of each agent draws its fault
from a hash of (model, request text, how many times that exact request came before), so which
attempt fails does not depend on timing or on the order the calls arrive in.

Per attempt: 30 % 429 with Retry-After, 8 % 5xx (500, 502, 503), 6 % a malformed 200 (cut-off
JSON or JSON with no expected field), 4 % a hang (the reply comes only after a minute: the
agent's own timeout ends the attempt), the rest a good answer.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from collections.abc import Callable

from tests.agent_server import Reply
from tests.agent_server.reply import Responder

RATE_LIMITED, SERVER_ERROR, MALFORMED, HANG = 30, 38, 44, 48  # cumulative percentages
RETRY_AFTER_S = 0.5
HANG_S = 60.0


class Storm:
    """Responders that wrap a good answer in the storm; `drawn` counts the faults sent."""

    def __init__(self, seed: str = "storm") -> None:
        self.seed = seed
        self._seen: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.drawn: Counter[str] = Counter()

    def responder(self, model: str, answer: Callable[[str], str]) -> Responder:
        def respond(prompt: str) -> str | Reply:
            key = f"{self.seed}\x1f{model}\x1f{prompt}"
            with self._lock:
                n = self._seen[key]
                self._seen[key] += 1
            roll = int.from_bytes(hashlib.sha256(f"{key}\x1f{n}".encode()).digest()[:4]) % 100
            fault, reply = self._fault(roll, answer, prompt)
            with self._lock:
                self.drawn[fault] += 1
            return reply

        return respond

    @staticmethod
    def _fault(roll: int, answer: Callable[[str], str], prompt: str) -> tuple[str, str | Reply]:
        if roll < RATE_LIMITED:
            return "429", Reply.error(429, "rate limited: slow down", retry_after=RETRY_AFTER_S)
        if roll < SERVER_ERROR:
            status = (500, 502, 503)[roll % 3]
            return "5xx", Reply.error(status, "the server had an error")
        if roll < MALFORMED:
            return "malformed", Reply.malformed("json" if roll % 2 else "fields")
        if roll < HANG:
            return "hang", Reply.ok(answer(prompt)).after(HANG_S)
        return "ok", answer(prompt)
