"""A prepared powers-of-tau file for snarkjs's `groth16 setup`, written directly from a known tau.

`snarkjs powersoftau prepare phase2` takes ~48 min at power 16 on a 2-vCPU machine (the snarkjs
anchor); the peer only needs a proving key, and `groth16 setup` for a circuit of domain 2^k reads
only: the header, the first point of sections 4, 5 and 6 (alpha G1, beta G1, beta G2), points of
section 2 that it hashes, block k of sections 12-15 (the Lagrange bases of tau G1, tau G2,
alpha tau G1, beta tau G1) and the odd points of block k+1 of section 12 (the H query). Those
are computed here exactly; every other point is the generator. snarkjs's Lagrange block k is
the inverse FFT of [tau^j G] with omega = Fr.w[k], i.e. L_i(tau) G in natural order (roots.mjs
checks that convention and prints the roots). Points are written affine, little-endian,
Montgomery form (snarkjs's "LEM"). tau is known: for benchmarking only, NOT A TRUSTED SETUP.

usage: python make_ptau.py ROOTS.json OUT.ptau POWER BLOCK [BLOCK...]
(a block k serves circuits of domain 2^k; POWER > every BLOCK)
"""

from __future__ import annotations

import json
import random
import struct
import sys

from cuzk_engine.curve import G1Point, G2Point
from cuzk_engine.field import MODULUS as R
from cuzk_engine.groth16.setup import _multiply_all  # the setup's parallel fixed-base products

Q = 0x1A0111EA397FE69A4B1BA7B6434BACD764774B84F38512BF6730D2A0F6B0F6241EABFFFEB153FFFFB9FEFFFFFFFFAAAB
MONT = (1 << 384) % Q
G1_BYTES, G2_BYTES = 96, 192


def lagrange(tau: int, omega: int, k: int, odd_only: bool = False) -> list[int]:
    """L_i(tau) = (tau^n - 1) / n * w^i / (tau - w^i) on the domain of size n = 2^k."""
    n = 1 << k
    zn = (pow(tau, n, R) - 1) * pow(n, -1, R) % R
    out, wi = [], 1
    for i in range(n):
        if i & 1 or not odd_only:
            out.append(zn * wi * pow(tau - wi, -1, R) % R)
        wi = wi * omega % R
    return out


def lem(xy: bytes) -> bytes:
    """arkworks' canonical LE x||y (any number of 48-byte Fp coordinates) -> Montgomery LE."""
    return b"".join((int.from_bytes(xy[i:i + 48], "little") * MONT % Q).to_bytes(48, "little")
                    for i in range(0, len(xy), 48))


def section(real: dict[int, bytes], blocks: int, generator: bytes) -> bytes:
    """Blocks 0..blocks-1 of 2^p points: computed ones where given (all points, or the odd ones
    with the generator between them), else the generator."""
    size = len(generator)
    parts = []
    for p in range(blocks):
        n = 1 << p
        points = real.get(p)
        if points is None:
            parts.append(generator * n)
        elif len(points) == n * size:
            parts.append(points)
        else:
            parts.append(b"".join(generator + points[i * size:(i + 1) * size]
                                  for i in range(n // 2)))
    return b"".join(parts)


def main() -> None:
    roots_path, out, power, blocks = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                      [int(x) for x in sys.argv[4:]])
    if not blocks or max(blocks) >= power:
        sys.exit("every BLOCK must be below POWER (block k+1 of section 12 must exist)")
    with open(roots_path) as f:
        roots = json.load(f)
    rnd = random.Random(20261202)
    tau, alpha, beta = (rnd.randrange(2, R) for _ in range(3))
    jobs = [("alpha1", "g1", [alpha]), ("beta1", "g1", [beta]), ("beta2", "g2", [beta])]
    for k in blocks:
        lk = lagrange(tau, int(roots[str(k)]), k)
        jobs += [(f"12.{k}", "g1", lk), (f"13.{k}", "g2", lk),
                 (f"14.{k}", "g1", [alpha * x % R for x in lk]),
                 (f"15.{k}", "g1", [beta * x % R for x in lk]),
                 (f"12.{k + 1}", "g1", lagrange(tau, int(roots[str(k + 1)]), k + 1, True))]
    points = {name: lem(xy) for name, xy in _multiply_all(jobs, None).items()}

    def real(sid: int) -> dict[int, bytes]:
        return {int(name.split(".")[1]): xy for name, xy in points.items()
                if name.startswith(f"{sid}.")}

    g1, g2 = lem(G1Point().to_xy_bytes_le()), lem(G2Point().to_xy_bytes_le())
    header = struct.pack("<I", 48) + Q.to_bytes(48, "little") + struct.pack("<II", power, power)
    sections = [(1, header), (2, g1 * ((1 << (power + 1)) - 1)), (3, g2),
                (4, points["alpha1"]), (5, points["beta1"]), (6, points["beta2"]),
                (12, section(real(12), power + 2, g1)), (13, section(real(13), power + 1, g2)),
                (14, section(real(14), power + 1, g1)), (15, section(real(15), power + 1, g1))]
    with open(out, "wb") as f:
        f.write(b"ptau" + struct.pack("<II", 1, len(sections)))
        for sid, body in sections:
            f.write(struct.pack("<IQ", sid, len(body)))
            f.write(body)
    print(f"{out}: power {power}, Lagrange blocks {blocks} computed (tau known: benchmark only)")


if __name__ == "__main__":
    main()
