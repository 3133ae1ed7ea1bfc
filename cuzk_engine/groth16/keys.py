"""Verifying keys, proving parameters, and their files in the parameter cache.

`<cache>/<circuit_id>.vk` is the verifying key as vk.json (compressed points in hex).
`<cache>/<circuit_id>.params` is the proving key:
    magic "CUZKPRM1" | u32 LE header length | JSON header | body
The header names the circuit and its shape, the section sizes, the SHA-256 of the body and of
the .vk file, and says loudly that this is NOT A TRUSTED SETUP. The body holds affine
little-endian x||y points (96-byte G1, 192-byte G2) and u32 variable-index lists, the cheap
format to load; a digest check replaces per-point subgroup checks of our own files.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cuzk_engine.curve import (
    G1_XY,
    G2_XY,
    G1Bases,
    G1Point,
    G2Bases,
    G2Point,
    g1_from_compressed,
    g2_from_compressed,
)
from cuzk_engine.errors import ParameterFileError, ProofFormatError

MAGIC = b"CUZKPRM1"
FORMAT_VERSION = 1
NOT_TRUSTED = "NOT A TRUSTED SETUP - test parameters from a seeded, reproducible setup"

# body sections in file order: (name, element size in bytes)
SECTIONS = (
    ("alpha_g1", G1_XY), ("beta_g1", G1_XY), ("delta_g1", G1_XY),
    ("beta_g2", G2_XY), ("delta_g2", G2_XY),
    ("a_indices", 4), ("b_indices", 4),
    ("a_query", G1_XY), ("b_g1_query", G1_XY), ("b_g2_query", G2_XY),
    ("l_query", G1_XY), ("h_query", G1_XY),
)
_SECTION_SIZE = dict(SECTIONS)


class VerifyingKey:
    """alpha in G1; beta, gamma, delta in G2; IC (one G1 point per public input, plus one)."""

    def __init__(self, alpha_g1: G1Point, beta_g2: G2Point, gamma_g2: G2Point,
                 delta_g2: G2Point, ic: list[G1Point]):
        self.alpha_g1 = alpha_g1
        self.beta_g2 = beta_g2
        self.gamma_g2 = gamma_g2
        self.delta_g2 = delta_g2
        self.ic = list(ic)

    @property
    def num_public_inputs(self) -> int:
        return len(self.ic) - 1

    def to_json(self) -> dict:
        return {
            "alpha_g1": self.alpha_g1.to_compressed_bytes().hex(),
            "beta_g2": self.beta_g2.to_compressed_bytes().hex(),
            "gamma_g2": self.gamma_g2.to_compressed_bytes().hex(),
            "delta_g2": self.delta_g2.to_compressed_bytes().hex(),
            "ic": [p.to_compressed_bytes().hex() for p in self.ic],
        }

    @classmethod
    def from_json(cls, d: dict) -> VerifyingKey:
        if not isinstance(d, dict):
            raise ProofFormatError("verifying key: expected a JSON object")
        missing = [k for k in ("alpha_g1", "beta_g2", "gamma_g2", "delta_g2", "ic") if k not in d]
        if missing:
            raise ProofFormatError(f"verifying key: missing {', '.join(missing)}")
        if not isinstance(d["ic"], list) or not d["ic"]:
            raise ProofFormatError("verifying key: ic must be a non-empty list")

        def raw(name: str, value: object) -> bytes:
            if not isinstance(value, str):
                raise ProofFormatError(f"verifying key: {name} must be a hex string")
            try:
                return bytes.fromhex(value)
            except ValueError:
                raise ProofFormatError(f"verifying key: {name} is not valid hex") from None

        return cls(
            g1_from_compressed(raw("alpha_g1", d["alpha_g1"]), "vk alpha_g1"),
            g2_from_compressed(raw("beta_g2", d["beta_g2"]), "vk beta_g2"),
            g2_from_compressed(raw("gamma_g2", d["gamma_g2"]), "vk gamma_g2"),
            g2_from_compressed(raw("delta_g2", d["delta_g2"]), "vk delta_g2"),
            [g1_from_compressed(raw(f"ic[{i}]", v), f"vk ic[{i}]") for i, v in enumerate(d["ic"])],
        )

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=1) + "\n").encode()


@dataclass
class ParamsHeader:
    circuit_id: str
    num_variables: int
    num_inputs: int  # including ONE
    num_constraints: int
    domain_log: int
    counts: dict[str, int]
    body_sha256: str
    vk_sha256: str

    def to_json(self) -> dict:
        return {"format": FORMAT_VERSION, "warning": NOT_TRUSTED, **self.__dict__}

    @property
    def body_length(self) -> int:
        return sum(self.counts[name] * size for name, size in SECTIONS)


class Parameters:
    """A loaded proving key (lives in the engine's SRS cache)."""

    def __init__(self, header: ParamsHeader, vk: VerifyingKey, sections: dict[str, bytes]):
        self.header = header
        self.circuit_id = header.circuit_id
        self.vk = vk
        point = G1Point.from_xy_bytes_unchecked_le
        self.alpha_g1 = point(sections["alpha_g1"])
        self.beta_g1 = point(sections["beta_g1"])
        self.delta_g1 = point(sections["delta_g1"])
        self.beta_g2 = G2Point.from_xy_bytes_unchecked_le(sections["beta_g2"])
        self.delta_g2 = G2Point.from_xy_bytes_unchecked_le(sections["delta_g2"])
        self.a_indices = np.frombuffer(sections["a_indices"], dtype="<u4").astype(np.int64)
        self.b_indices = np.frombuffer(sections["b_indices"], dtype="<u4").astype(np.int64)
        self.a_query = G1Bases(sections["a_query"])
        self.b_g1_query = G1Bases(sections["b_g1_query"])
        self.b_g2_query = G2Bases(sections["b_g2_query"])
        self.l_query = G1Bases(sections["l_query"])
        self.h_query = G1Bases(sections["h_query"])
        self.nbytes = (sum(q.nbytes for q in (self.a_query, self.b_g1_query, self.b_g2_query,
                                              self.l_query, self.h_query))
                       + self.a_indices.nbytes + self.b_indices.nbytes)

    @property
    def num_variables(self) -> int:
        return self.header.num_variables

    @property
    def num_inputs(self) -> int:
        return self.header.num_inputs

    @property
    def num_constraints(self) -> int:
        return self.header.num_constraints

    @property
    def domain_log(self) -> int:
        return self.header.domain_log


def parameter_paths(param_cache: Path, circuit_id: str) -> tuple[Path, Path]:
    base = Path(param_cache)
    return base / f"{circuit_id}.params", base / f"{circuit_id}.vk"


def regenerate_hint(circuit_id: str) -> str:
    kind, _, profile = circuit_id.rpartition(".")
    return (f"regenerate with `python -m cuzk_engine setup --kind {kind} --profile {profile} "
            f"--force` (add --param-cache DIR if you use a non-default cache)")


def write_parameter_files(param_cache: Path, header: ParamsHeader, body: bytes,
                          vk_bytes: bytes) -> None:
    """Write .vk then .params, each to a temporary file renamed into place."""
    params_path, vk_path = parameter_paths(param_cache, header.circuit_id)
    params_path.parent.mkdir(parents=True, exist_ok=True)
    header_bytes = json.dumps(header.to_json(), sort_keys=True).encode()
    for path, chunks in ((vk_path, [vk_bytes]),
                         (params_path, [MAGIC, struct.pack("<I", len(header_bytes)),
                                        header_bytes, body])):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the cache from other users
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def read_header(params_path: Path, circuit_id: str) -> tuple[ParamsHeader, int]:
    """The parsed header and the body's offset; checks magic, shape and total length."""
    hint = regenerate_hint(circuit_id)
    try:
        with open(params_path, "rb") as f:
            prefix = f.read(len(MAGIC) + 4)
            if len(prefix) < len(MAGIC) + 4 or prefix[:len(MAGIC)] != MAGIC:
                raise ParameterFileError(f"{params_path}: not a cuzk parameter file; {hint}")
            (header_len,) = struct.unpack("<I", prefix[len(MAGIC):])
            header_raw = f.read(header_len)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise ParameterFileError(f"{params_path}: missing; {hint.replace(' --force', '')}") \
            from None
    except OSError as exc:
        raise ParameterFileError(f"{params_path}: cannot read ({exc.strerror}); {hint}") from None
    try:
        raw = json.loads(header_raw)
        if raw.pop("format") != FORMAT_VERSION:
            raise ValueError("unsupported format version")
        raw.pop("warning")
        header = ParamsHeader(**raw)
        if set(header.counts) != set(_SECTION_SIZE):
            raise ValueError("unexpected sections")
    except (ValueError, TypeError, KeyError, AttributeError):
        raise ParameterFileError(f"{params_path}: corrupt header; {hint}") from None
    if header.circuit_id != circuit_id:
        raise ParameterFileError(
            f"{params_path}: holds parameters for {header.circuit_id}, not {circuit_id}; {hint}")
    offset = len(MAGIC) + 4 + header_len
    if size != offset + header.body_length:
        raise ParameterFileError(
            f"{params_path}: truncated or padded ({size} bytes, expected "
            f"{offset + header.body_length}); {hint}")
    return header, offset


def load_vk_file(vk_path: Path, circuit_id: str) -> tuple[VerifyingKey, bytes]:
    hint = regenerate_hint(circuit_id)
    try:
        raw = vk_path.read_bytes()
    except FileNotFoundError:
        raise ParameterFileError(f"{vk_path}: missing; {hint}") from None
    try:
        return VerifyingKey.from_json(json.loads(raw)), raw
    except (ValueError, ProofFormatError) as exc:
        raise ParameterFileError(f"{vk_path}: corrupt verifying key ({exc}); {hint}") from None


def load_parameter_files(param_cache: Path, circuit_id: str) -> Parameters:
    params_path, vk_path = parameter_paths(param_cache, circuit_id)
    header, offset = read_header(params_path, circuit_id)
    hint = regenerate_hint(circuit_id)
    with open(params_path, "rb") as f:
        f.seek(offset)
        body = f.read()
    if hashlib.sha256(body).hexdigest() != header.body_sha256:
        raise ParameterFileError(f"{params_path}: corrupt body (digest mismatch); {hint}")
    vk, vk_raw = load_vk_file(vk_path, circuit_id)
    if hashlib.sha256(vk_raw).hexdigest() != header.vk_sha256:
        raise ParameterFileError(f"{vk_path}: does not belong to {params_path.name}; {hint}")
    sections, pos = {}, 0
    for name, size in SECTIONS:
        length = header.counts[name] * size
        sections[name] = body[pos:pos + length]
        pos += length
    try:
        return Parameters(header, vk, sections)
    except ValueError as exc:  # a point off the curve despite a matching digest
        raise ParameterFileError(f"{params_path}: invalid point ({exc}); {hint}") from None
