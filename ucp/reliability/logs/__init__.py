"""Cluster log analysis: failure taxonomy mining, incidents, lemon nodes and MTTF.

The entry point is :func:`analyze_logs`; the command line is ``ucp logs analyze``
(docs/LOGS.md). Nothing here imports torch.

Example::

    from ucp.reliability.logs import analyze_logs, dask_runner
    result = analyze_logs(["/var/log/slurm", "kern.log.gz"], run=dask_runner(workers=4))
    print(result.rates["failures_per_1000_node_days"], len(result.incidents), len(result.discovered))
"""

from ucp.reliability.logs.analyze import AnalysisOptions, LogAnalysis, analyze_logs
from ucp.reliability.logs.errors import LogInputError, TaxonomyError, TemplateStateError
from ucp.reliability.logs.parallel import dask_runner
from ucp.reliability.logs.taxonomy import Taxonomy, load_taxonomy
from ucp.reliability.logs.template_state import TemplateSet
from ucp.reliability.logs.templates import parse_templates

__all__ = ["AnalysisOptions", "LogAnalysis", "analyze_logs", "LogInputError", "TaxonomyError",
           "TemplateStateError", "Taxonomy", "load_taxonomy", "TemplateSet", "parse_templates", "dask_runner"]
