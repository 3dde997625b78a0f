"""Wire models the market builds itself, without pydantic's per-call work.

Validation belongs at the edge, where bytes come in (:mod:`streams.core.router` parses every
event once). What the market then makes of its own checked data — a release, an outcome, a
receipt, a sale, an envelope it has just sealed — needs no second check, and pydantic's
:meth:`~pydantic.BaseModel.model_construct`, the documented way to skip it, still costs more
than validating a small model: it walks every field's aliases and defaults on every call
(~4 µs for a :class:`~streams.wire.events.ReleasedValue`; a purchase builds a dozen such
objects). :func:`trusted` makes the same object — the same ``__dict__``, fields set and extra,
so the same JSON — from a layout worked out once per model class.

It serves plain models only: no aliases, no private attributes or post-init hook, no extra
fields kept, no mutable default shared between instances; any other is refused when it is
first used, rather than built differently (``tests/streams/wire/test_trusted.py`` compares
it with ``model_construct`` for every class the core builds with it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

__all__ = ["trusted"]

M = TypeVar("M", bound=BaseModel)

_IMMUTABLE = (type(None), bool, int, float, str, bytes, tuple, frozenset)
_MISSING = object()
_set = object.__setattr__


@dataclass(frozen=True, slots=True)
class _Layout:
    """A model class's fields, in order, as :func:`trusted` fills them."""

    template: dict[str, Any]
    """Every field in order: its default, or :data:`_MISSING` (required, or a factory's)."""
    names: frozenset[str]
    required: frozenset[str]
    factories: tuple[tuple[str, Callable[[], Any]], ...]


_LAYOUTS: dict[type[BaseModel], _Layout] = {}


def _layout(cls: type[BaseModel]) -> _Layout:
    config = cls.model_config
    if (
        cls.__pydantic_root_model__
        or cls.__pydantic_post_init__
        or cls.__private_attributes__
        or config.get("extra") == "allow"
    ):
        raise TypeError(f"{cls.__name__} is not a plain model: build it with model_construct")
    template: dict[str, Any] = {}
    required: set[str] = set()
    factories: list[tuple[str, Callable[[], Any]]] = []
    for name, field in cls.model_fields.items():
        if field.alias not in (None, name) or field.validation_alias is not None:
            raise TypeError(f"{cls.__name__}.{name} has an alias: build it with model_construct")
        template[name] = _MISSING
        if field.default_factory is not None:
            if field.default_factory_takes_validated_data:
                raise TypeError(f"{cls.__name__}.{name}'s default reads other fields")
            factories.append((name, cast("Callable[[], Any]", field.default_factory)))
        elif field.default is PydanticUndefined:
            required.add(name)
        elif isinstance(field.default, _IMMUTABLE):
            template[name] = field.default
        else:
            raise TypeError(f"{cls.__name__}.{name} has a mutable default: use a factory")
    layout = _Layout(template, frozenset(template), frozenset(required), tuple(factories))
    _LAYOUTS[cls] = layout
    return layout


def trusted(cls: type[M], /, **fields: Any) -> M:
    """An instance of ``cls`` holding ``fields`` as given, unchecked (the rest at their
    defaults): what ``cls.model_construct(**fields)`` makes, for data the market made itself.

    Raises
    ------
    TypeError
        A required field is missing or a name is not a field (a bug: ``model_construct``
        would build a model that fails when it is written), or ``cls`` is not a plain model.
    """
    layout = _LAYOUTS.get(cls) or _layout(cls)
    given = fields.keys()
    if not layout.required <= given or not given <= layout.names:
        missing = sorted(layout.required - given)
        raise TypeError(
            f"{cls.__name__}: missing {missing}, unknown {sorted(given - layout.names)}"
        )
    data = {**layout.template, **fields}
    for name, factory in layout.factories:
        if name not in fields:
            data[name] = factory()
    m = cls.__new__(cls)
    _set(m, "__dict__", data)
    _set(m, "__pydantic_fields_set__", set(fields))
    _set(m, "__pydantic_extra__", None)
    _set(m, "__pydantic_private__", None)
    return m
