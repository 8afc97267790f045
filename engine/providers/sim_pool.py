"""Rehearsal pools nobody tuned to: a sim pool and a task file for it, generated from a seed.

`conductor sim pool --agents N --tags T --seed S` writes both. The seed picks T task kinds from
the bank below, K questions of each, the agents' names and who is good at what; every agent gets
the same description, so a conductor that scores well on such a pool has learned the routing
from rewards, not read it off the pool. Two skill layouts:

- `one`: one competent agent per tag (skill `high`), the others weak (`low`): tags are dealt to
  the agents in a seeded order, round-robin, so with N >= T every tag has its own specialist;
- `random`: every (agent, tag) skill drawn uniformly in [low, high], then the best agent of each
  tag raised to `high`, so every tag still has one agent worth routing to.

Everything is a pure function of the arguments (SHA-256 draws, no `random`), so the same command
writes the same files on any machine and Python version.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

SkillLayout = Literal["one", "random"]

DESCRIPTION = "A general-purpose assistant."
"""Every generated agent's description: alike on purpose."""

NAMES = ("atlas", "birch", "cobalt", "dune", "ember", "fjord", "garnet", "harbor", "indigo",
         "juniper", "kestrel", "lumen", "maple", "nimbus", "onyx", "pine", "quartz", "raven",
         "sierra", "tundra", "umber", "vale", "willow", "zephyr")
"""Agent names: neutral words with distinct first letters, so no name hints at a skill."""

# The bank of task kinds: tag -> (verifier, question pattern, (subject, answer) items).
_BANK: dict[str, tuple[str, str, tuple[tuple[str, str], ...]]] = {
    "geography": ("exact", "What is the capital of {}?", (
        ("France", "Paris"), ("Japan", "Tokyo"), ("Canada", "Ottawa"), ("Italy", "Rome"),
        ("Egypt", "Cairo"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Norway", "Oslo"),
        ("Spain", "Madrid"), ("Germany", "Berlin"), ("Greece", "Athens"), ("Cuba", "Havana"),
        ("Poland", "Warsaw"), ("Austria", "Vienna"), ("Ireland", "Dublin"),
        ("Portugal", "Lisbon"))),
    "language": ("exact", "What is the opposite of the word '{}'?", (
        ("hot", "cold"), ("big", "small"), ("fast", "slow"), ("light", "dark"),
        ("happy", "sad"), ("early", "late"), ("full", "empty"), ("hard", "soft"),
        ("young", "old"), ("wet", "dry"), ("thick", "thin"), ("rich", "poor"),
        ("loud", "quiet"), ("push", "pull"), ("win", "lose"), ("high", "low"))),
    "code": ("exact", "In Python, which {}?", (
        ("keyword defines a function", "def"), ("builtin returns the length of a list", "len"),
        ("keyword defines a class", "class"), ("keyword brings in a module", "import"),
        ("keyword makes an anonymous function", "lambda"), ("keyword makes a generator",
                                                             "yield"),
        ("builtin makes a sequence of integers", "range"), ("builtin converts text to an "
                                                              "integer", "int"),
        ("builtin gives the type of an object", "type"), ("value stands for nothing", "None"),
        ("builtin returns a new sorted list", "sorted"), ("builtin opens a file", "open"),
        ("keyword leaves a loop early", "break"), ("keyword skips to the next loop pass",
                                                   "continue"),
        ("builtin prints to the console", "print"), ("keyword raises an exception",
                                                     "raise"))),
    "chemistry": ("exact", "What is the chemical symbol of the element {}?", (
        ("gold", "Au"), ("silver", "Ag"), ("iron", "Fe"), ("sodium", "Na"),
        ("potassium", "K"), ("lead", "Pb"), ("copper", "Cu"), ("tin", "Sn"),
        ("mercury", "Hg"), ("oxygen", "O"), ("carbon", "C"), ("helium", "He"),
        ("neon", "Ne"), ("calcium", "Ca"), ("zinc", "Zn"), ("hydrogen", "H"))),
    "astronomy": ("exact", "In our solar system, which {}?", (
        ("planet is closest to the Sun", "Mercury"), ("planet is the largest", "Jupiter"),
        ("planet is called the red planet", "Mars"), ("planet has the brightest rings",
                                                      "Saturn"),
        ("planet is the farthest from the Sun", "Neptune"), ("planet is the hottest", "Venus"),
        ("planet spins on its side", "Uranus"), ("body is the star at its centre", "Sun"),
        ("dwarf planet was once the ninth planet", "Pluto"), ("planet do we live on",
                                                             "Earth"),
        ("planet has the Great Red Spot", "Jupiter"), ("planet has the moon Titan", "Saturn"),
        ("planet has the moon Triton", "Neptune"), ("planet has the moons Phobos and Deimos",
                                                    "Mars"),
        ("dwarf planet is the largest in the asteroid belt", "Ceres"),
        ("planet is second from the Sun", "Venus"))),
    "history": ("exact", "In which year {}?", (
        ("did the Second World War end", "1945"), ("did the First World War begin", "1914"),
        ("did people first land on the Moon", "1969"), ("did the Berlin Wall fall", "1989"),
        ("did Columbus first reach the Americas", "1492"), ("did the French Revolution begin",
                                                           "1789"),
        ("was the US Declaration of Independence signed", "1776"), ("did the Titanic sink",
                                                                   "1912"),
        ("did the First World War end", "1918"), ("did the Second World War begin", "1939"),
        ("was the Magna Carta sealed", "1215"), ("was the Battle of Hastings fought", "1066"),
        ("did the Soviet Union dissolve", "1991"), ("did the American Civil War end", "1865"),
        ("was the printing press of Gutenberg built, roughly", "1440"),
        ("did Napoleon lose at Waterloo", "1815"))),
    "animals": ("exact", "What is a baby {} called?", (
        ("cat", "kitten"), ("dog", "puppy"), ("cow", "calf"), ("sheep", "lamb"),
        ("horse", "foal"), ("goat", "kid"), ("duck", "duckling"), ("frog", "tadpole"),
        ("kangaroo", "joey"), ("swan", "cygnet"), ("bear", "cub"), ("pig", "piglet"),
        ("goose", "gosling"), ("owl", "owlet"), ("deer", "fawn"), ("hen", "chick"))),
}


def _arithmetic(k: int, seed: int) -> tuple[str, str]:
    """The k-th arithmetic question of a seed: a product or a sum of two small numbers."""
    a, b = 2 + _draw(seed, "math", k, "a") % 18, 2 + _draw(seed, "math", k, "b") % 18
    if _draw(seed, "math", k, "op") % 2:
        return f"What is {a} x {b}?", str(a * b)
    return f"What is {a * 7} + {b * 11}?", str(a * 7 + b * 11)


TAGS: tuple[str, ...] = ("math", *_BANK)
"""Every task kind the generator knows (`--tags` takes at most this many)."""
MAX_TASKS_PER_TAG = min(len(items) for _, _, items in _BANK.values())


def _draw(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8],
                          "big")


def _ranked(seq: Sequence[str], *key: object) -> list[str]:
    """`seq` in a seeded order (a uniform permutation for a fixed key)."""
    return sorted(seq, key=lambda x: (_draw(*key, x), x))


class SimPoolSpec(BaseModel):
    """What `conductor sim pool` generates."""

    agents: int = Field(default=4, ge=1, le=len(NAMES))
    tags: int = Field(default=4, ge=1, le=len(TAGS))
    seed: int = Field(default=0, ge=0, le=2**31)
    tasks_per_tag: int = Field(default=8, ge=1, le=MAX_TASKS_PER_TAG)
    skills: SkillLayout = "one"
    high: float = Field(default=0.95, ge=0, le=1, description="a competent agent's skill")
    low: float = Field(default=0.1, ge=0, le=1, description="a weak agent's skill")
    max_steps: int = Field(default=1, ge=1, le=20, description="steps a plan may have")
    subtask_chars: int = Field(
        default=8, ge=8, le=2000,
        description="the longest subtask a plan may write. Sim agents never read it, so its "
        "tokens carry no reward and only add noise to the policy gradient (8 is the least the "
        "plan grammar allows)")
    latency_s: float = Field(default=0.0, ge=0)

    def agent_names(self) -> list[str]:
        return _ranked(NAMES, self.seed, "names")[: self.agents]

    def tag_names(self) -> list[str]:
        return sorted(_ranked(TAGS, self.seed, "tags")[: self.tags])

    def skill_matrix(self) -> dict[str, dict[str, float]]:
        """agent -> tag -> probability of a right answer."""
        agents, tags = self.agent_names(), self.tag_names()
        if self.skills == "one":
            order = _ranked(tags, self.seed, "deal")
            expert = {tag: agents[i % len(agents)] for i, tag in enumerate(order)}
            return {a: {t: self.high if expert[t] == a else self.low for t in tags}
                    for a in agents}
        span = self.high - self.low
        matrix = {a: {t: round(self.low + span * (_draw(self.seed, "skill", a, t) % 1001) / 1000,
                               3) for t in tags} for a in agents}
        for t in tags:
            best = max(agents, key=lambda a: (matrix[a][t], a))
            matrix[best][t] = self.high
        return matrix


def competent(matrix: dict[str, dict[str, float]], tags: Sequence[str]) -> set[str]:
    """The agents with the best skill for a task with these tags (the routing to learn)."""
    def skill(agent: str) -> float:
        known = [matrix[agent][t] for t in tags if t in matrix[agent]]
        return max(known) if known else 0.0

    best = max((skill(a) for a in matrix), default=0.0)
    return {a for a in matrix if skill(a) == best}


def tasks(spec: SimPoolSpec) -> list[dict[str, object]]:
    """The task file's rows: `tasks_per_tag` questions of each tag, interleaved by tag."""
    dataset = f"sim-pool-{spec.seed}"
    options = {"max_steps": spec.max_steps, "subtask_max_chars": spec.subtask_chars}
    per_tag: dict[str, list[dict[str, object]]] = {}
    for tag in spec.tag_names():
        if tag == "math":
            rows = [_arithmetic(k, spec.seed) for k in range(spec.tasks_per_tag)]
            verifier = "math"
        else:
            verifier, pattern, items = _BANK[tag]
            picked = _ranked([s for s, _ in items], spec.seed, "items", tag)[: spec.tasks_per_tag]
            answers = dict(items)
            rows = [(pattern.format(s), answers[s]) for s in picked]
        per_tag[tag] = [{"id": f"{dataset}-{tag}-{k}", "question": q, "answer": a,
                         "verifier": verifier, "tags": [tag], "dataset": dataset,
                         "options": options} for k, (q, a) in enumerate(rows)]
    return [row for k in range(spec.tasks_per_tag) for tag in sorted(per_tag)
            for row in per_tag[tag][k : k + 1]]


def conductor_section(conductor: str, *, max_tokens: int) -> list[str]:
    """A generated pool's conductor: the local model in the bare plan form (a small model that
    reasons first spends its budget before the plan), sampled at temperature 1 for rollouts."""
    return [
        "offer_conductor_as_agent = false",
        "",
        "[conductor]",
        'id = "conductor"',
        'provider = "local"',
        f'model = "{conductor}"',
        'description = "The conductor itself."',
        f"params = {{ temperature = 1.0, max_tokens = {max_tokens} }}",
        "timeout_s = 300",
        'plan_form = "bare"',
    ]


def pool_toml(spec: SimPoolSpec, conductor: str = "smollm2-135m-instruct") -> str:
    """The pool file: the local conductor in the bare plan form, and the sim agents."""
    matrix = spec.skill_matrix()
    lines = [
        f"# Generated by `conductor sim pool --agents {spec.agents} --tags {spec.tags} "
        f"--seed {spec.seed} --skills {spec.skills}`:",
        "# look-alike sim agents; the skills below are what the conductor must learn.",
        "",
        *conductor_section(conductor, max_tokens=96),
    ]
    for agent, skills in matrix.items():
        table = ", ".join(f"{t} = {p}" for t, p in skills.items())
        lines += [
            "",
            "[[agents]]",
            f'id = "{agent}"',
            'provider = "sim"',
            'model = "sim"',
            f'description = "{DESCRIPTION}"',
            "price_input_per_mtok = 1.0",
            "price_output_per_mtok = 4.0",
            f"sim = {{ skills = {{ {table} }}, default_skill = {spec.low}, "
            f"latency_s = {spec.latency_s} }}",
        ]
    return "\n".join(lines) + "\n"
