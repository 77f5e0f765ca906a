"""Every core a test of services/ drives (tests/cores.py) is checked at the test's end."""

from tests.cores import cores_checked

__all__ = ["cores_checked"]
