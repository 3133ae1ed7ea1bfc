"""The fake moved to `vastmgr/remote/fake_vast.py` (the simulated day's market uses it too); this
name stays for test branches written against the old path."""

from vastmgr.remote.fake_vast import FakeVast  # noqa: F401
