"""Settings for the whole suite.

Hypothesis' default deadline (200 ms per example) is a timing assertion: on a loaded 2-core CI
machine a slow example fails a property test that holds. Properties are checked without it.
"""

from hypothesis import settings

settings.register_profile("suite", deadline=None)
settings.load_profile("suite")
