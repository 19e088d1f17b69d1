"""Failure detection that does not depend on knowing the message.

A line is judged by evidence any log carries: the severity its header names
(:mod:`ucp.reliability.logs.header`), words of failure in its content (and words
that take the failure back: "corrected", "succeeded"; or make it a security
event: "authentication failure"), exception blocks, and how its template
behaves over the run: rare templates on few nodes are suspects, templates
seen everywhere all the time are routine. A logistic model over these
features (coefficients in ``ucp/reliability/data/detector.json``, fitted by
``ucp/tools/bench/logs_loso.py --write-model`` on labeled lines of many systems)
turns them into a probability; lines at or above the threshold are failures.

Every feature is a property of the text and of counts, never of a product
name, so the model can be judged on systems it never saw (leave-one-system-out,
docs/LOGS.md).

Example::

    detector = Detector.load()
    evidence = line_evidence("data TLB error interrupt", severity=CRITICAL)
    detector.probability(evidence, TemplateStats(lines=3, nodes=2, total_lines=10_000, total_nodes=64))
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from importlib import resources

from ucp.reliability.logs.errors import TaxonomyError
from ucp.reliability.logs.header import CRITICAL, DEBUG, ERROR, INFO, WARNING

# Words that report something going wrong, whatever the system (stems; matched on word starts). A word
# starts after anything but a letter, or at a capital after a small letter (camel case), so words inside
# identifiers count too: ERROR_FILE_NOT_FOUND, io_error, onConnectionFailed.
_W = "(?![A-Za-z])"  # the end of a whole word
_FAILURE = re.compile(
    r"(?:(?<![A-Za-z])|(?-i:(?<=[a-z])(?=[A-Z])))"  # a word's start: after a non-letter, or camel case
    r"(?:fail|error|err" + _W + r"|errno|fatal|panic|abort|crash|segfault|segmentation fault|oops|"
    r"exception|timed? ?out|timeout|unreachable|not reachable|refused|lost" + _W + r"|loss of|dead" + _W + r"|"
    r"deadlock|corrupt|killed|kill(?:ing)? process|terminat|not respond|no (?:answer|response|reply)|not answer|"
    r"unresponsive|unable|cannot|can't|could not|couldn't|bad" + _W + r"|invalid|unavailable|broken|"
    r"down" + _W + r"|offline|hung|hang" + _W + r"|stuck|overflow|violation|mismatch|degraded|critical|exceed|"
    r"missing|no such|not found|denied|reject|discard|drop(?:ped|ping)?" + _W + r"|fault|trap|assert|halt|"
    r"shutdown|stop(?:ped|ping) execution|severed|disconnect|reset|retry|retrying|unexpected|illegal|"
    r"over ?limit|overheat|too (?:many|high|hot)|out of|insufficient|exhaust|abnormal|problem|unhealthy|evict|"
    r"preempt|throttl)",
    re.IGNORECASE)
# Error codes, which say "failure" in numbers and constants (read from the content: templates mask them).
# Each convention is documented by its owner: COM/Windows HRESULTs with the failure bit set and E_
# constants, POSIX errno names, negative return codes, HTTP 5xx server errors (4xx are the client's).
_ERROR_CODE = re.compile(
    r"(?i:\b(?:hresult|hr)\s*[=:]?\s*0x8[0-9a-f]{7}\b)"
    r"|\b(?:[A-Z][A-Z0-9]*_)?E_[A-Z][A-Z0-9_]*\b"
    r"|\bE(?:IO|NOENT|ACCES|PERM|TIMEDOUT|CONNREFUSED|CONNRESET|CONNABORTED|HOSTUNREACH|HOSTDOWN|NETUNREACH|"
    r"NETDOWN|NOSPC|NOMEM|PIPE|BUSY|ROFS|STALE|REMOTEIO|NODEV|NXIO|BADF|FAULT|DQUOT|NOTCONN|SHUTDOWN|PROTO|"
    r"MFILE|NFILE|NOEXEC|DEADLK|NOLCK|COMM|OVERFLOW|NOBUFS)\b"
    r"|(?i:\b(?:rc|ret|retval|errno|return(?:ed)? code|returned)\s*[=:]?\s*-\d+\b)"
    r"|(?i:\bstatus(?: code)?\s*[=:]?\s*5\d\d\b|\bHTTP/\d(?:\.\d)?\"?\s+5\d\d\b)")
# Failure words that rarely appear in routine traffic.
_STRONG = re.compile(
    r"\b(?:fatal|panic|crash|segfault|segmentation fault|oops|machine check|kernel terminated|core dump|"
    r"out of memory|uncorrectable|unrecoverable|catastrophic|hardware error|fallen off|assert(?:ion)? fail|"
    r"failed|failure|stopping execution|not responding|i/o error|lost connection|link down|node fail|"
    r"abort(?:ed|ing)?|bus error|double[- ]bit|parity error|checksum error|stack trace|traceback|abnormal)",
    re.IGNORECASE)
# Words that take the failure back, or report a normal state.
_BENIGN = re.compile(
    r"\b(?:corrected|correctable|recovered|succeeded|successful(?:ly)?|success|ok\b|restored|resolved|cleared|"
    r"normal|no errors?\b|0 errors?\b|errors?[=:] ?0\b|without (?:error|problem)|is up\b|link up|back online|"
    r"healthy|deprecated)",
    re.IGNORECASE)
# Security events: an operator's concern, not a system failure.
_AUTH = re.compile(
    r"\b(?:authenticat|password|passwd|login|logname|invalid user|preauth|sudo\b|pam_unix|"
    r"user unknown|break-in|permission|credential|unauthori[sz]ed|kerberos|certificate)",
    re.IGNORECASE)
_EXCEPTION = re.compile(r"(?:\b[A-Z]\w*(?:Exception|Error)\b|^Traceback \(most recent call last\)|"
                        r"^Caused by:|^Exception in thread|\bthrew\b|\bthrown\b)")

FEATURES = ("bias", "sev_none", "sev_debug", "sev_info", "sev_warning", "sev_error", "sev_critical",
            "failure_words", "strong", "benign", "auth", "exception", "dump", "rarity", "spread")
THRESHOLD = 0.5


@dataclass(frozen=True)
class LineEvidence:
    """What the text of one line (its content and severity) says, before counts are known."""

    severity: int | None
    failure_words: int
    strong: bool
    benign: bool
    auth: bool
    exception: bool
    dump: bool

    @property
    def any(self) -> bool:
        """Whether anything in the text points at a failure (lines without any are never failures).

        Words of failure, an exception, or an error-or-worse level on a line that
        reports something: a level alone on a dump line (registers, addresses)
        or a warning alone is not evidence.
        """
        return bool(self.failure_words or self.strong or self.exception
                    or (self.severity is not None and self.severity >= ERROR and not self.dump))


@dataclass(frozen=True)
class TemplateStats:
    """How a template behaved over the whole run: lines and nodes it was seen in, of how many."""

    lines: int
    nodes: int
    total_lines: int
    total_nodes: int


def line_evidence(content: str, *, severity: int | None, raw: str | None = None) -> LineEvidence:
    """The text features of one line's content (its header already split off).

    ``content`` is what the words are read from (the template text: words inside
    values do not count); error codes are read from ``raw``, the content with its
    values, when given.

    >>> e = line_evidence("instruction cache parity error corrected", severity=INFO)
    >>> (e.failure_words, e.strong, e.benign)
    (1, True, True)
    >>> line_evidence("Opening store [HRESULT <*> - E_ACCESSDENIED]", severity=INFO,
    ...               raw="Opening store [HRESULT = 0x80070005 - E_ACCESSDENIED]").failure_words
    2
    """
    words = len(_FAILURE.findall(content))
    if raw is not None:
        words += len(_ERROR_CODE.findall(raw))
    strong = _STRONG.search(content) is not None
    if strong and not words:
        # A strong phrase is a failure word too ("GPU has fallen off the bus", "uncorrectable", "machine
        # check"); without this count it was weighed only against routine boot lines that name one.
        words = 1
    return LineEvidence(
        severity=severity, failure_words=min(words, 3), strong=strong,
        benign=_BENIGN.search(content) is not None, auth=_AUTH.search(content) is not None,
        exception=_EXCEPTION.search(content) is not None,
        dump=is_dump(content))


def failure_phrase(text: str, *, before: int = 2, after: int = 3) -> str | None:
    """The words around the first failure word of ``text`` (values left out), or None.

    >>> failure_phrase("<*> to=root, delay=<*>, stat=Deferred: Connection refused by <*>")
    'stat=Deferred: Connection refused by'
    """
    m = _FAILURE.search(text)
    if m is None:
        return None
    head = [w for w in text[:m.start()].split() if "<*>" not in w][-before:]
    tail = [w for w in text[m.start():].split() if "<*>" not in w][:after + 1]
    return " ".join(head + tail)


def is_dump(text: str) -> bool:
    """Whether a line is data rather than a report: mostly values and ``name:``/``name=`` tokens.

    >>> is_dump("instruction address: <*>"), is_dump("r<*>=<*> r<*>=<*>"), is_dump("data TLB error interrupt")
    (True, True, False)
    """
    tokens = text.split()
    if tokens and tokens[-1].endswith(":"):  # "general purpose registers:", "Call Trace:" introduce data
        return True
    data = sum(1 for t in tokens if "<*>" in t or "=" in t or t.endswith(":") or not any(c.isalpha() for c in t))
    return bool(tokens) and 2 * data >= len(tokens)


def feature_vector(evidence: LineEvidence, stats: TemplateStats) -> list[float]:
    """The model's inputs, in :data:`FEATURES` order."""
    sev = evidence.severity
    rarity = 1.0 - math.log1p(stats.lines) / math.log1p(max(stats.total_lines, 2))
    spread = stats.nodes / stats.total_nodes if stats.total_nodes else 0.0
    return [1.0, float(sev is None), float(sev == DEBUG), float(sev == INFO), float(sev == WARNING),
            float(sev == ERROR), float(sev == CRITICAL), evidence.failure_words / 3.0, float(evidence.strong),
            float(evidence.benign), float(evidence.auth), float(evidence.exception), float(evidence.dump),
            max(0.0, rarity), min(1.0, spread)]


@dataclass(frozen=True)
class Detector:
    """A logistic model over :data:`FEATURES`: ``weights`` by feature name, and its threshold."""

    weights: dict
    threshold: float = THRESHOLD

    def probability(self, evidence: LineEvidence, stats: TemplateStats) -> float:
        """P(failure) for a line with this evidence in a template with these counts (0 without evidence)."""
        if not evidence.any:
            return 0.0
        z = sum(self.weights.get(name, 0.0) * x for name, x in zip(FEATURES, feature_vector(evidence, stats)))
        return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))

    def to_dict(self) -> dict:
        return {"version": 1, "features": list(FEATURES), "weights": dict(self.weights),
                "threshold": self.threshold}

    @classmethod
    def from_dict(cls, data: dict, *, origin: str = "detector") -> "Detector":
        if not isinstance(data, dict) or data.get("version") != 1 or not isinstance(data.get("weights"), dict):
            raise TaxonomyError(f"{origin}: expected {{\"version\": 1, \"weights\": {{...}}}}")
        weights = data["weights"]
        unknown = sorted(set(weights) - set(FEATURES))
        if unknown or not all(isinstance(v, (int, float)) for v in weights.values()):
            raise TaxonomyError(f"{origin}: weights must be numbers for the features {list(FEATURES)}"
                                + (f"; unknown: {unknown}" if unknown else ""))
        return cls(weights={k: float(v) for k, v in weights.items()},
                   threshold=float(data.get("threshold", THRESHOLD)))

    @classmethod
    def load(cls) -> "Detector":
        """The shipped model (``ucp/reliability/data/detector.json``)."""
        text = resources.files("ucp.reliability").joinpath("data/detector.json").read_text("utf-8")
        return cls.from_dict(json.loads(text), origin="ucp/reliability/data/detector.json")
