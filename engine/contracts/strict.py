"""Models that refuse what they do not know, and changes that go through their checks.

pydantic's `model_copy` with `update` validates nothing: `update={"sampel": 3}` adds a stray
attribute, `update={"sample": -5}` a value the field refuses. `revised` is the copy with
changes that goes through the model's own validation instead. `known_names` is the
before-validator of the models a user or a file sets (`extra="forbid"` on each): a misspelt
name is refused with the closest name there is. Both are pure pydantic, so a workflow may call
them inside Temporal's sandbox.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Collection, Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import AliasChoices, BaseModel, ConfigDict, model_validator

M = TypeVar("M", bound=BaseModel)


def revised(model: M, /, **changes: Any) -> M:
    """A new instance of `model`'s own class (a subclass stays one) with `changes`, validated
    as input to that class: field constraints and validators run on the result, and a name
    that is no field is a TypeError naming the class and the name.

    Cheap: nested models are passed as the instances they are (pydantic does not revalidate
    them), so the cost is that of checking the fields themselves
    (tests/benchmarks/bench_revised.py). The fields set stay those of `model` plus the changed
    ones, as `model_copy` keeps them, so dumps with `exclude_unset` are unchanged."""
    cls = type(model)
    fields = cls.model_fields
    unknown = [name for name in changes if name not in fields]
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {unknown[0]!r}"
                        f"{''.join(f', nor {n!r}' for n in unknown[1:])}")
    data = {name: getattr(model, name) for name in fields}
    if model.model_extra:
        data.update(model.model_extra)
    data.update(changes)
    new = cls.model_validate(data, by_name=True)
    object.__setattr__(new, "__pydantic_fields_set__", model.model_fields_set | changes.keys())
    return new


@functools.cache
def names_of(cls: type[BaseModel]) -> frozenset[str]:
    """Every name `cls` reads a field under: its own, and its aliases (once per class)."""
    names = set(cls.model_fields)
    for field in cls.model_fields.values():
        for alias in (field.alias, field.validation_alias):
            if isinstance(alias, str):
                names.add(alias)
            elif isinstance(alias, AliasChoices):
                names.update(c for c in alias.choices if isinstance(c, str))
    return frozenset(names)


def known_names(cls: type[BaseModel], data: Any, also: Collection[str] = (),
                elsewhere: Mapping[str, str] | None = None) -> Any:
    """`data` unchanged when every key of it is a name of `cls` (or in `also`); else a
    ValueError naming the first unknown key and the closest known name, one line a person can
    act on (pydantic's own `extra="forbid"` says only "Extra inputs are not permitted").
    `elsewhere` maps names that are not `cls`'s to where they live instead; a key that is (or
    is close to) one of them is told so, rather than offered an unrelated name."""
    if not isinstance(data, dict):
        return data
    names = names_of(cls)
    unknown = [k for k in data if k not in names and k not in also]
    if not unknown:
        return data
    known = names | set(also)
    elsewhere = elsewhere or {}
    name = str(unknown[0])
    close = difflib.get_close_matches(name, sorted(known | elsewhere.keys()), n=1)
    if name in elsewhere:
        hint = f": {elsewhere[name]}"
    elif close and close[0] in elsewhere:
        hint = f"; if you meant {close[0]!r}: {elsewhere[close[0]]}"
    elif close:
        hint = f"; did you mean {close[0]!r}?"
    else:
        hint = f"; known: {', '.join(sorted(known))}"
    more = f" (also unknown: {', '.join(map(repr, unknown[1:]))})" if unknown[1:] else ""
    raise ValueError(f"unknown {cls.__name__} field {name!r}{hint}{more}")


class Strict(BaseModel):
    """A model a user or a file sets: an unknown name is an error (`known_names`), never a
    setting silently left at its default. `also_known` names keys a subclass's own
    before-validator moves elsewhere; `elsewhere` names that belong to another model, each
    with where it lives (the message says so)."""

    model_config = ConfigDict(extra="forbid")
    also_known: ClassVar[Collection[str]] = ()
    elsewhere: ClassVar[Mapping[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _known_names(cls, data: Any) -> Any:
        return known_names(cls, data, cls.also_known, cls.elsewhere)
