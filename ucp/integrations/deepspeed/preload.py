"""Imported by a launcher's fork server so DeepSpeed ranks start in milliseconds.

``import deepspeed`` and the first ``deepspeed.initialize`` (its ZeRO optimizer check
imports torch's compiler stack) cost seconds of CPU per process; a fork server that
imported them once shares that with every rank it forks. Does nothing when
DeepSpeed is not installed.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("deepspeed") is not None:
    from ucp.integrations.deepspeed.trainer import import_deepspeed

    import_deepspeed()
    import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401 - what initialize() imports first
