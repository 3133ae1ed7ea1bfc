"""A small state-machine helper shared by models whose status moves along fixed edges."""

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from vastmgr.lib.errors import IllegalTransition


def check_transition(label: str, allowed: Mapping[Any, AbstractSet[str]], current: str,
                     target: str) -> None:
    """`allowed`: each state's reachable states; its keys are a model's TextChoices members."""
    if target not in allowed:
        raise IllegalTransition(f"{label}: unknown state {target!r}")
    if target not in allowed[current]:
        reachable = ", ".join(sorted(allowed[current])) or "nothing (final state)"
        raise IllegalTransition(
            f"{label}: cannot move from {current!r} to {target!r}; {current!r} can move to {reachable}"
        )
