"""Checkpoint formats behind one reader/writer protocol and a registry (see :mod:`ucp.formats.base`).

Each format lives in its own module here and registers itself on import;
importing ``ucp.formats`` registers them all. Order of registration is the
order :func:`detect_format` tries them in (most specific first): folders with
a marker file of their own, then single files.
"""

from ucp.formats.base import (  # noqa: F401
    Format,
    FormatReader,
    FormatWriter,
    TensorInfo,
    TrainingState,
    UnknownFormatError,
    blocks,
    detect_format,
    formats,
    get_format,
    parse_size,
    register_format,
)

# One import per format, most specific detection first (each line registers one module's formats).
import ucp.formats.ucp_format  # (manifest.json)
import ucp.formats.dcp  # (.metadata)
import ucp.formats.safetensors_format  # (*.safetensors, model.safetensors.index.json)
import ucp.formats.hf_torch  # (pytorch_model.bin, pytorch_model.bin.index.json)
import ucp.formats.deepspeed.zero  # (registers deepspeed-zero)
import ucp.formats.deepspeed.pipeline  # (registers deepspeed-pipeline)
import ucp.formats.deepspeed.universal  # (registers deepspeed-universal)
from ucp.formats import megatron  # noqa: F401  (registers megatron)
import ucp.formats.torch_file  # noqa: F401  (one torch.save file: last, it matches any .pt)
