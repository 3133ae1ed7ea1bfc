"""Errors the engine reports to users. Each carries a message meant to be printed as is."""


class CuzkError(Exception):
    """Base of every error the engine reports to users."""


class InvalidRequest(CuzkError):
    """Unknown kind or profile, bad seed, bad partition index."""


class ParameterFileError(CuzkError):
    """A missing, truncated or corrupt .params/.vk file; the message names the file and the
    command that regenerates it."""


class ProofFormatError(CuzkError):
    """Wrong length, bad point encoding, a point off the curve or outside the subgroup, or a
    public input that is not a field element."""


class UnsatisfiedCircuit(CuzkError):
    """The witness does not satisfy the circuit; the message names the first failing constraint."""


class SnapshotFormatError(CuzkError, ValueError):
    """A status snapshot's JSON is missing a part or has one of the wrong shape."""
