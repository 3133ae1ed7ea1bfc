"""Rank-1 constraint systems: variables, linear combinations, `enforce`, witness, density.

Variable 0 is the constant ONE; public inputs follow it (they must all be allocated before
the first private variable, as in bellman's input/aux split) and private ("aux") variables
come last. A linear combination is a dict {variable: coefficient}. `enforce` records the
values of its three combinations on the witness as it goes, so the a/b/c vectors the prover
needs exist the moment synthesis ends.

A system built with `matrices=False` (the prover's mode) keeps only values: callers that know
the values (the gadgets) pass them and may pass None for the combinations, which is several
times faster. The setup builds with `matrices=True`, and `check_satisfied` then also checks
every recorded value against its combination, so the two modes cannot silently disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cuzk_engine.errors import UnsatisfiedCircuit
from cuzk_engine.field import MODULUS

ONE = 0

LC = dict[int, int]


def lc_eval(lc: LC, values: list[int]) -> int:
    return sum(coeff * values[var] for var, coeff in lc.items()) % MODULUS


@dataclass
class ConstraintSystem:
    matrices: bool = True
    values: list[int] = field(default_factory=lambda: [1])
    num_inputs: int = 1  # ONE plus the public inputs
    a: list[LC] = field(default_factory=list)
    b: list[LC] = field(default_factory=list)
    c: list[LC] = field(default_factory=list)
    a_vals: list[int] = field(default_factory=list)
    b_vals: list[int] = field(default_factory=list)
    c_vals: list[int] = field(default_factory=list)
    # constraint j was added under labels[label_of[j]]; one label per gadget call, not per row
    labels: list[str] = field(default_factory=lambda: ["circuit"])
    label_of: list[int] = field(default_factory=list)
    _label: int = 0
    _sealed: bool = False

    # -- variables ---------------------------------------------------------------------------
    @property
    def num_variables(self) -> int:
        return len(self.values)

    @property
    def num_constraints(self) -> int:
        return len(self.a_vals)

    def alloc_input(self, value: int) -> int:
        if len(self.values) != self.num_inputs:
            raise RuntimeError("public inputs must be allocated before private variables")
        self.values.append(value % MODULUS)
        self.num_inputs += 1
        return len(self.values) - 1

    def alloc(self, value: int) -> int:
        self.values.append(value % MODULUS)
        return len(self.values) - 1

    @property
    def public_inputs(self) -> list[int]:
        return self.values[1:self.num_inputs]

    # -- constraints -------------------------------------------------------------------------
    def label(self, text: str) -> None:
        """Name the constraints added from now on (reported when one of them fails)."""
        self.labels.append(text)
        self._label = len(self.labels) - 1

    def enforce(self, a: LC | None, b: LC | None, c: LC | None,
                values: tuple[int, int, int] | None = None) -> None:
        """a * b = c. `values` are the three combinations' values when the caller knows them."""
        if self._sealed:
            raise RuntimeError("constraint system is sealed")
        if values is None or self.matrices:
            if a is None or b is None or c is None:
                raise RuntimeError("the constraint's linear combinations are needed: to evaluate "
                                   "it, or to keep the matrices")
            if values is None:
                values = (lc_eval(a, self.values), lc_eval(b, self.values),
                          lc_eval(c, self.values))
            if self.matrices:
                self.a.append(a)
                self.b.append(b)
                self.c.append(c)
        self.a_vals.append(values[0] % MODULUS)
        self.b_vals.append(values[1] % MODULUS)
        self.c_vals.append(values[2] % MODULUS)
        self.label_of.append(self._label)

    def extend(self, new_values: Sequence[int], a: Sequence[int], b: Sequence[int],
               c: Sequence[int]) -> None:
        """Values only: allocate `new_values` and add the rows a[j] * b[j] = c[j] in one step,
        for gadgets that compute a whole trace at once. Every value must be canonical."""
        if self._sealed:
            raise RuntimeError("constraint system is sealed")
        if self.matrices:
            raise RuntimeError("the constraints' linear combinations are needed: to keep the "
                               "matrices")
        self.values.extend(new_values)
        self.a_vals.extend(a)
        self.b_vals.extend(b)
        self.c_vals.extend(c)
        self.label_of.extend([self._label] * len(a))

    def seal(self) -> None:
        """Bind every public input (and ONE) with `x * 0 = 0`, as bellman does.

        Without this an input that appears in no A row would get an all-zero IC point, and a
        verifier would accept any value for it. The rows make A_i(tau) of distinct inputs
        linearly independent, which is also what keeps the IC points distinct.
        """
        if self._sealed:
            return
        self.label("public input binding")
        for var in range(self.num_inputs):
            self.enforce({var: 1}, {}, {})
        self._sealed = True

    # -- checks ------------------------------------------------------------------------------
    def first_unsatisfied(self) -> int | None:
        for j, (x, y, z) in enumerate(zip(self.a_vals, self.b_vals, self.c_vals)):
            if x * y % MODULUS != z:
                return j
        return None

    def check_satisfied(self) -> None:
        if self.matrices:
            for j, lcs in enumerate(zip(self.a, self.b, self.c)):
                recorded = (self.a_vals[j], self.b_vals[j], self.c_vals[j])
                if tuple(lc_eval(lc, self.values) for lc in lcs) != recorded:
                    raise UnsatisfiedCircuit(
                        f"constraint {j} ({self.labels[self.label_of[j]]}): its linear "
                        f"combinations disagree with the values the gadget recorded")
        self.raise_unsatisfied(self.first_unsatisfied())

    def raise_unsatisfied(self, j: int | None) -> None:
        if j is not None:
            raise UnsatisfiedCircuit(
                f"constraint {j} ({self.labels[self.label_of[j]]}) is not satisfied: "
                f"a*b != c with a={self.a_vals[j]}, b={self.b_vals[j]}, c={self.c_vals[j]}")

    def density(self) -> tuple[list[bool], list[bool]]:
        if not self.matrices:
            raise RuntimeError("density needs a system built with matrices=True")
        """Which variables occur in some A row / some B row. A variable absent from every A
        row has A_i(tau) = 0, so its MSM term can be skipped (bellperson's density)."""
        in_a = [False] * self.num_variables
        in_b = [False] * self.num_variables
        for lc in self.a:
            for v in lc:
                in_a[v] = True
        for lc in self.b:
            for v in lc:
                in_b[v] = True
        return in_a, in_b
