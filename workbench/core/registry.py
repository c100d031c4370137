"""Name -> function registries (one signature per family, like verl's ``register_policy_loss``).

Adding an algorithm means registering one function under a new name; callers look functions up
by the name a recipe carries, and an unknown name fails with the list of registered names.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

F = TypeVar("F", bound=Callable)


class UnknownNameError(ValueError):
    """A name that no function of a registry carries."""


class Registry(Generic[F]):
    """A named family of interchangeable functions sharing one signature.

    >>> LOSSES = Registry("policy loss")
    >>> @LOSSES.register("clip")
    ... def clip_loss(...): ...
    >>> LOSSES.get("clip")
    """

    def __init__(self, family: str) -> None:
        self.family = family
        self._functions: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator registering a function under ``name`` (names are unique per family)."""

        def decorate(fn: F) -> F:
            if name in self._functions:
                raise ValueError(f"{self.family} {name!r} is already registered")
            self._functions[name] = fn
            return fn

        return decorate

    def unregister(self, name: str) -> F:
        """Remove ``name`` (e.g. a test's temporary entry); returns its function."""
        self.get(name)  # UnknownNameError listing the known names
        return self._functions.pop(name)

    def get(self, name: str) -> F:
        """The function registered as ``name``; UnknownNameError listing the known names otherwise."""
        try:
            return self._functions[name]
        except (KeyError, TypeError):
            raise UnknownNameError(
                f"unknown {self.family} {name!r}; registered: {', '.join(self.names())}"
            ) from None

    def names(self) -> tuple[str, ...]:
        return tuple(self._functions)

    def __contains__(self, name: object) -> bool:
        return name in self._functions

    def __iter__(self) -> Iterator[str]:
        return iter(self._functions)

    def __len__(self) -> int:
        return len(self._functions)


def check_choice(field: str, value: str, allowed: tuple[str, ...] | list[str]) -> str:
    """Validate a string option against its allowed values, naming the field on failure."""
    if value not in allowed:
        raise ValueError(f"{field}={value!r} is not allowed; choose one of: {', '.join(allowed)}")
    return value
