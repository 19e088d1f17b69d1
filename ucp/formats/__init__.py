"""Checkpoint formats behind one reader/writer protocol and a registry (see :mod:`ucp.formats.base`).

Each format lives in its own module here and registers itself on import;
importing ``ucp.formats`` registers them all. Order of registration is the
order :func:`detect_format` tries them in (most specific first).
"""

from ucp.formats.base import (  # noqa: F401
    Format,
    FormatReader,
    FormatWriter,
    TensorInfo,
    TrainingState,
    UnknownFormatError,
    detect_format,
    formats,
    get_format,
    register_format,
)

from ucp.formats import deepspeed_zero  # noqa: E402,F401  (registers deepspeed-zero)
from ucp.formats import deepspeed_pipeline  # noqa: E402,F401  (registers deepspeed-pipeline)
from ucp.formats import deepspeed_universal  # noqa: E402,F401  (registers deepspeed-universal)
from ucp.formats import megatron  # noqa: E402,F401  (registers megatron)
