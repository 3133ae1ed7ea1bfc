"""Radix-2 evaluation domains over Fr and a pure-Python NTT (the fallback when no C compiler
is present; the hot path runs the native kernels through `cuzk_engine.backend`)."""

from __future__ import annotations

from dataclasses import dataclass

from cuzk_engine.field import (
    GENERATOR,
    MODULUS,
    TWO_ADICITY,
    batch_inverse,
    inverse,
    root_of_unity,
)


@dataclass(frozen=True)
class Domain:
    """The multiplicative subgroup H of size n = 2^log_n, and its coset g*H with g = 7."""

    log_n: int

    @classmethod
    def for_size(cls, at_least: int) -> Domain:
        log_n = max(1, (at_least - 1).bit_length())
        if log_n > TWO_ADICITY:
            raise ValueError(f"domain of {at_least} points exceeds Fr's 2-adicity")
        return cls(log_n)

    @property
    def size(self) -> int:
        return 1 << self.log_n

    @property
    def omega(self) -> int:
        return root_of_unity(self.log_n)

    @property
    def size_inv(self) -> int:
        return inverse(self.size)

    def vanishing_at(self, x: int) -> int:
        """Z(x) = x^n - 1."""
        return (pow(x, self.size, MODULUS) - 1) % MODULUS

    def vanishing_on_coset_inv(self) -> int:
        """1 / Z(g*w^i), the same for every i because (g*w^i)^n = g^n."""
        return inverse(self.vanishing_at(GENERATOR))

    def lagrange_at(self, x: int) -> list[int]:
        """L_i(x) for every i: the evaluations of the Lagrange basis of H at x (x not in H)."""
        n = self.size
        omega = self.omega
        z = self.vanishing_at(x)
        if z == 0:
            raise ValueError("x lies in the domain")
        # L_i(x) = Z(x) * w^i / (n * (x - w^i))
        powers = [1] * n
        for i in range(1, n):
            powers[i] = powers[i - 1] * omega % MODULUS
        denoms = batch_inverse([(x - w) % MODULUS for w in powers])
        scale = z * self.size_inv % MODULUS
        return [scale * w % MODULUS * d % MODULUS for w, d in zip(powers, denoms)]


def ntt_python(values: list[int], omega: int) -> list[int]:
    """Iterative radix-2 NTT: out[k] = sum_j values[j] * omega^(jk); len(values) a power of 2."""
    n = len(values)
    log_n = n.bit_length() - 1
    a = [values[int(format(i, f"0{log_n}b")[::-1], 2)] for i in range(n)] if n > 1 else list(values)
    half = 1
    while half < n:
        w_step = pow(omega, n // (2 * half), MODULUS)
        twiddles = [1] * half
        for j in range(1, half):
            twiddles[j] = twiddles[j - 1] * w_step % MODULUS
        for start in range(0, n, 2 * half):
            for j in range(half):
                u = a[start + j]
                v = a[start + j + half] * twiddles[j] % MODULUS
                a[start + j] = (u + v) % MODULUS
                a[start + j + half] = (u - v) % MODULUS
        half *= 2
    return a


def transform_python(values: list[int], log_n: int, *, inverse_: bool, coset: bool) -> list[int]:
    """The Backend.ntt contract on Python ints (see cuzk_engine.backend)."""
    n = 1 << log_n
    omega = root_of_unity(log_n)
    if not inverse_:
        if coset:
            g_pow = 1
            shifted = []
            for v in values:
                shifted.append(v * g_pow % MODULUS)
                g_pow = g_pow * GENERATOR % MODULUS
            values = shifted
        return ntt_python(values, omega)
    out = ntt_python(values, inverse(omega))
    n_inv = inverse(n)
    out = [v * n_inv % MODULUS for v in out]
    if coset:
        g_inv = inverse(GENERATOR)
        g_pow = 1
        for i in range(n):
            out[i] = out[i] * g_pow % MODULUS
            g_pow = g_pow * g_inv % MODULUS
    return out
