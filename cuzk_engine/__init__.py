"""cuzk_engine: a pipelined Groth16 proving engine over BLS12-381.

This package never imports Django; the dashboard talks to it only through its HTTP API.
"""

__version__ = "0.1.0"
