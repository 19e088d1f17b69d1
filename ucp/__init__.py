"""ucp: the Universal Checkpoint format and engine."""

from ucp.errors import *  # noqa: F401,F403
from ucp.errors import UcpError  # noqa: F401
from ucp.geometry import Box, FlatRange  # noqa: F401
from ucp.layout import Layout  # noqa: F401
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec  # noqa: F401
