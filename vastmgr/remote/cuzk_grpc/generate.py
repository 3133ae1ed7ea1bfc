"""Regenerate the Python code for `proving.proto` with grpcio-tools.

`python -m vastmgr.remote.cuzk_grpc.generate` writes `proving_pb2.py`, its type stub
`proving_pb2.pyi` and `proving_pb2_grpc.py` next to the .proto; the generated files are
committed, so neither the dashboard nor an install needs grpcio-tools. A test regenerates them into
a temporary folder and fails when the committed ones differ.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
PROTO = PACKAGE / "proving.proto"
ROOT = PACKAGE.parents[2]  # the repository: module paths follow the .proto's path under it


def generate(out: Path = ROOT) -> None:
    """Write the generated modules under `out`, in the folders their module paths name."""
    proto = PROTO.relative_to(ROOT)
    # grpcio-tools is a development dependency: the generated modules are committed.
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT}",
                    f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}",
                    str(proto)], check=True, cwd=ROOT)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
