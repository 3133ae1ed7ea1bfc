"""A small state-machine helper shared by models whose status moves along fixed edges."""


class IllegalTransition(ValueError):
    """Raised when a model is asked to move to a state its current state cannot reach."""


def check_transition(label: str, allowed: dict[str, set[str]], current: str, target: str) -> None:
    if target not in allowed:
        raise IllegalTransition(f"{label}: unknown state {target!r}")
    if target not in allowed[current]:
        reachable = ", ".join(sorted(allowed[current])) or "nothing (final state)"
        raise IllegalTransition(
            f"{label}: cannot move from {current!r} to {target!r}; {current!r} can move to {reachable}"
        )
