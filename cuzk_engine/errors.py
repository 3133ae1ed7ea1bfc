"""Every error cuzk_engine raises of its own, in one place.

``CuzkError`` and its subclasses are reported to users; each carries a message meant to be
printed as is (the HTTP API answers them as a 4xx or 503 with that message). The others say that
the configuration is wrong, that the engine itself has a bug, or that a GPU toolchain is missing.
"""


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


# ---------------------------------------------------------------- the engine's answers to requests


class EngineNotAccepting(CuzkError):
    """The engine is draining or stopped and takes no new jobs."""


class RequestConflict(CuzkError):
    """A request_id was reused for a different request."""


class JobNotFound(CuzkError):
    """No job with that id (never submitted, or its result retention ran out)."""


class BudgetExceeded(CuzkError):
    """A single reservation is larger than the whole memory budget and can never fit."""


class SrsInUse(CuzkError):
    """Eviction was asked for parameters that a running job still uses."""


# ---------------------------------------------------------------- talking to an engine (client)


class EngineError(CuzkError):
    """Anything that went wrong talking to an engine."""


class EngineAPIError(EngineError):
    """The engine refused the request (HTTP 4xx)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class EngineUnreachable(EngineError):
    """No usable answer from the engine; retry later. `status` is the HTTP status when the
    engine did answer (503: draining, not accepting), else None."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------- configuration and bugs


class ConfigError(ValueError):
    """The configuration file or a value in it is invalid; the message names the key."""


class StatusTransitionError(RuntimeError):
    """An engine component asked for a transition the status model forbids (a bug)."""


# ---------------------------------------------------------------- GPU toolchain


class CudaUnavailable(RuntimeError):
    """cupy is missing, no driver/device is usable, or the ordinal does not exist."""


class CompilerUnavailable(RuntimeError):
    """No C compiler to build the native GPU host code with."""


class NvrtcUnavailable(RuntimeError):
    """No NVRTC library could be loaded (the nvidia-cuda-nvrtc-cu12 wheel is not installed)."""


class KernelCompileError(RuntimeError):
    """A CUDA kernel source did not compile; ``log`` is NVRTC's log."""

    def __init__(self, source: str, log: str):
        super().__init__(f"{source} failed to compile:\n{log}")
        self.source = source
        self.log = log
