"""The parameter cache's files, read and written without the curve or numpy.

`<cache>/<circuit_id>.vk` is the verifying key as vk.json (compressed points in hex).
`<cache>/<circuit_id>.params` is the proving key:
    magic "CUZKPRM1" | u32 LE header length | JSON header | body
The header names the circuit and its shape, the section sizes, the SHA-256 of the body and of
the .vk file, and says loudly that this is NOT A TRUSTED SETUP. The body holds affine
little-endian x||y points (96-byte G1, 192-byte G2) and u32 variable-index lists, the cheap
format to load; a digest check replaces per-point subgroup checks of our own files.

This module imports only the standard library, so a `prove` process starts reading and digesting
its parameters (both release the GIL) before its heavy imports (numpy, the curve, the circuits)
and runs them side by side; cuzk_engine.groth16.keys turns the sections into points.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cuzk_engine.errors import ParameterFileError

# the sizes of the uncompressed affine x||y encoding (cuzk_engine.curve uses them too)
G1_XY = 96
G2_XY = 192

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


@dataclass
class ParameterFiles:
    """A circuit's two parameter files as read from the cache: the header, the .vk file's bytes
    (checked against the header's digest by check_vk, once they parse), and the body cut into
    its sections (digest checked)."""

    params_path: Path
    vk_path: Path
    header: ParamsHeader
    vk_raw: bytes
    sections: dict[str, bytes]


def read_parameter_files(param_cache: Path, circuit_id: str) -> ParameterFiles:
    """Reads each body section into its own bytes, the digest advancing section by section (so
    the body is never copied whole), and the .vk file."""
    params_path, vk_path = parameter_paths(Path(param_cache), circuit_id)
    header, offset = read_header(params_path, circuit_id)
    hint = regenerate_hint(circuit_id)
    digest = hashlib.sha256()
    sections = {}
    with open(params_path, "rb") as f:
        f.seek(offset)
        for name, size in SECTIONS:
            sections[name] = f.read(header.counts[name] * size)
            digest.update(sections[name])
    if digest.hexdigest() != header.body_sha256:
        raise ParameterFileError(f"{params_path}: corrupt body (digest mismatch); {hint}")
    try:
        vk_raw = vk_path.read_bytes()
    except FileNotFoundError:
        raise ParameterFileError(f"{vk_path}: missing; {hint}") from None
    return ParameterFiles(params_path, vk_path, header, vk_raw, sections)


def check_vk(files: ParameterFiles) -> None:
    """The .vk file must be the one the .params header was written with."""
    if hashlib.sha256(files.vk_raw).hexdigest() != files.header.vk_sha256:
        raise ParameterFileError(f"{files.vk_path}: does not belong to {files.params_path.name}; "
                                 f"{regenerate_hint(files.header.circuit_id)}")
