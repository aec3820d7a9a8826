"""Frozen records built about as fast as unfrozen ones: an `__init__` that fills a frozen dataclass's slots directly."""

from __future__ import annotations

import dataclasses
from typing import TypeVar

T = TypeVar("T", bound=type)

_FACTORY = object()  # stands for a field's default_factory in the generated signature


def quick_init(cls: T) -> T:
    """Give a `@dataclass(frozen=True, slots=True)` class an `__init__` that sets each slot through its descriptor.

    A frozen dataclass's own `__init__` goes through `object.__setattr__` once per field: on CPython 3.11 a
    record of nine fields took 1.2-2.0 us against 0.35 us unfrozen, and 0.56 us this way. The hot path builds
    several per event (the consumed record, its routed frame, the decoded event, its payload and resource):
    about a tenth of a worker's CPU at 9,000 events/s (py-spy). The record stays frozen, equal, hashable and
    `dataclasses.replace`-able; its signature is the dataclass's. Classes this cannot mirror exactly (no slots,
    not frozen, `__post_init__`, keyword-only or non-init fields) are refused at import.
    """
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"quick_init needs a frozen, slotted dataclass; {cls.__name__} is not one")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"quick_init cannot run {cls.__name__}.__post_init__")
    fields = dataclasses.fields(cls)
    if any(f.kw_only or not f.init for f in fields):
        raise TypeError(f"quick_init mirrors positional init fields only; {cls.__name__} has others")
    namespace: dict = {"_FACTORY": _FACTORY}
    signature, body = [], []
    for f in fields:
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__  # the slot's member descriptor
        value = f.name
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{f.name}"] = f.default
            signature.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_make_{f.name}"] = f.default_factory
            signature.append(f"{f.name}=_FACTORY")
            value = f"_make_{f.name}() if {f.name} is _FACTORY else {f.name}"
        else:
            signature.append(f.name)
        body.append(f"    _set_{f.name}(self, {value})")
    exec(f"def __init__(self, {', '.join(signature)}):\n" + "\n".join(body or ["    pass"]), namespace)  # noqa: S102
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[misc]
    return cls
