"""Template mining: drain3 behind a cache, with its state persisted for incremental runs.

drain3 is the miner; the cache in front of it is what makes a run fast. Lines
are masked first (:func:`reliability.logs.masking.mask`); a masked line seen
before costs one dict lookup, and only a new masked line reaches drain3.
Template ids are drain3's cluster ids, so with ``state_path`` a second run over
new logs keeps the ids the first run learned.

Example::

    store = TemplateStore(state_path="templates.drain3")
    tid = store.template_id("NVRM: Xid (PCI:<*>): #79, pid=<*>, GPU has fallen off the bus.")
    store.save()   # the next TemplateStore("templates.drain3") knows template `tid`
"""

from __future__ import annotations

import binascii
import os
import zlib

from drain3 import TemplateMiner
from drain3.file_persistence import FilePersistence
from drain3.template_miner_config import TemplateMinerConfig

from reliability.logs.errors import TemplateStateError


class _AtomicFilePersistence(FilePersistence):
    """drain3's file persistence, but a crash mid-write never leaves a torn state file."""

    def save_state(self, state: bytes) -> None:
        tmp = f"{self.file_path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as handle:
            handle.write(state)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.file_path)


class _BatchTemplateMiner(TemplateMiner):
    """A TemplateMiner that snapshots only when asked.

    drain3 serialises its whole tree on every new or changed template; over a
    batch run that is quadratic. We save once, at the end (:meth:`TemplateStore.save`).
    """

    def get_snapshot_reason(self, change_type, cluster_id):  # noqa: ARG002 - drain3's signature
        return None


def miner_config(*, masking: bool = False) -> TemplateMinerConfig:
    """The drain3 configuration we use; ``masking=True`` adds drain3's own regex masks (baseline)."""
    from drain3.masking import MaskingInstruction

    config = TemplateMinerConfig()
    config.drain_sim_th = 0.4
    config.drain_depth = 4
    config.drain_max_children = 100
    config.parametrize_numeric_tokens = True
    config.snapshot_compress_state = True
    config.profiling_enabled = False
    if masking:
        config.masking_instructions = [
            MaskingInstruction(r"((?<=[^A-Za-z0-9])|^)(\d+\.\d+\.\d+\.\d+)((?=[^A-Za-z0-9])|$)", "IP"),
            MaskingInstruction(r"((?<=[^A-Za-z0-9])|^)(0x[a-fA-F0-9]+)((?=[^A-Za-z0-9])|$)", "HEX"),
            MaskingInstruction(r"((?<=[^A-Za-z0-9])|^)([\-\+]?\d+)((?=[^A-Za-z0-9])|$)", "NUM"),
        ]
    return config


class TemplateStore:
    """Masked line -> drain3 template id, cached; optionally persisted to ``state_path``."""

    def __init__(self, *, state_path: str | None = None):
        self.state_path = state_path
        persistence = _AtomicFilePersistence(state_path) if state_path else None
        try:
            self._miner = _BatchTemplateMiner(persistence_handler=persistence, config=miner_config())
        except (ValueError, TypeError, KeyError, AttributeError, zlib.error, binascii.Error) as err:
            raise TemplateStateError(
                f"cannot load template state {state_path!r} ({type(err).__name__}: {err}); "
                "delete it to start afresh"
            ) from err
        self._ids: dict[str, int] = {}
        self.known_at_start = len(self._miner.drain.id_to_cluster)

    def template_id(self, masked: str) -> int:
        """The drain3 cluster id for a masked line (mined on first sight)."""
        tid = self._ids.get(masked)
        if tid is None:
            tid = self._miner.add_log_message(masked)["cluster_id"]
            self._ids[masked] = tid
        return tid

    def template(self, template_id: int) -> str:
        """The template text drain3 holds now for ``template_id``."""
        cluster = self._miner.drain.id_to_cluster.get(template_id)
        return cluster.get_template() if cluster is not None else ""

    def templates(self) -> dict[int, str]:
        """Every known template id -> text."""
        return {cid: c.get_template() for cid, c in self._miner.drain.id_to_cluster.items()}

    def save(self) -> None:
        """Write the drain3 state to ``state_path`` (atomically); no-op without one."""
        if self.state_path:
            self._miner.save_state("batch end")

