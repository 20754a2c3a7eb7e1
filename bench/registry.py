"""Name -> factory registries of the pieces users add, by the name that is also the config
file's stem and the records'; the config's ``ConfigError`` and ``Choice``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from enum import Enum
from typing import Generic, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A user-facing configuration problem: reported as one line, exit status 2."""


class Choice(str, Enum):
    """A config's choice field: a member equals and prints as its value; Hydra refuses others."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def values(cls) -> list[str]:
        return [m.value for m in cls]


class Registry(Generic[T]):
    """Named factories, a ``register(name)`` decorator refusing duplicates."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise KeyError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise ConfigError(
                f"unknown {self.kind} {name!r}; choose one of: {', '.join(sorted(self._items))}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def __len__(self) -> int:
        return len(self._items)
