"""Verifying keys and loaded proving parameters. The files themselves (format, paths, reading
with digest checks) are cuzk_engine.paramfile's; their names are re-exported here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from cuzk_engine.curve import (
    G1Bases,
    G1Point,
    G2Bases,
    G2Point,
    g1_from_compressed,
    g2_from_compressed,
)
from cuzk_engine.errors import ParameterFileError, ProofFormatError
from cuzk_engine.paramfile import (
    NOT_TRUSTED,
    SECTIONS,
    ParameterFiles,
    ParamsHeader,
    check_vk,
    parameter_paths,
    read_header,
    read_parameter_files,
    regenerate_hint,
    write_parameter_files,
)

__all__ = ["NOT_TRUSTED", "SECTIONS", "Parameters", "ParamsHeader", "VerifyingKey",
           "load_parameter_files", "parameter_paths", "parameters_from_files", "read_header",
           "write_parameter_files"]


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


def parameters_from_files(files: ParameterFiles) -> Parameters:
    """The points of files read (and digest-checked) by paramfile.read_parameter_files."""
    hint = regenerate_hint(files.header.circuit_id)
    try:
        vk = VerifyingKey.from_json(json.loads(files.vk_raw))
    except (ValueError, ProofFormatError) as exc:
        raise ParameterFileError(
            f"{files.vk_path}: corrupt verifying key ({exc}); {hint}") from None
    check_vk(files)
    try:
        return Parameters(files.header, vk, files.sections)
    except ValueError as exc:  # a point off the curve despite a matching digest
        raise ParameterFileError(f"{files.params_path}: invalid point ({exc}); {hint}") from None


def load_parameter_files(param_cache: Path, circuit_id: str) -> Parameters:
    return parameters_from_files(read_parameter_files(param_cache, circuit_id))
