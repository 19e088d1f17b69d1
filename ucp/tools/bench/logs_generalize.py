"""Does template mining survive a new envelope? GA per loghub system and envelope, ours vs drain3, one run.

Every loghub 2k system is re-written in each envelope of
:mod:`ucp.tools.bench.logs_envelopes` (forwarding prefixes, other timestamp
layouts, RFC 5424, JSON lines, a Kubernetes CRI prefix, the label column
removed), and both parsers read the re-written lines as a user would feed
them: ours through ``parse_templates`` on the file (it finds the envelope
itself), drain3 with its default configuration on the raw lines. Grouping
accuracy (Zhu et al. 2019) against loghub's ground-truth templates. Speed:
the CPU seconds of both, summed over the same files in the same run
(drain3: ``add_log_message`` over lines already in memory; ours: reading
the file included), interleaved per file.

Run:  .venv/bin/python ucp/tools/bench/logs_generalize.py                 # development envelopes
      .venv/bin/python ucp/tools/bench/logs_generalize.py --held-out      # envelopes not developed against
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from ucp.tools.bench.logs_envelopes import DEVELOPMENT, EnvelopeContext  # noqa: E402
from ucp.tools.bench.logs_templates import LOGHUB, SYSTEMS, drain3_groups, grouping_accuracy  # noqa: E402

from ucp.reliability.logs.templates import parse_templates  # noqa: E402


def load_system(name: str) -> tuple[list[str], list[dict]]:
    """(raw lines, structured rows) of one loghub 2k sample."""
    raw = (LOGHUB / f"{name}_2k.log").read_text(encoding="utf-8", errors="replace").splitlines()
    with open(LOGHUB / "structured" / f"{name}_2k.log_structured.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(raw) == len(rows), name
    return raw, rows


def enveloped(name: str, envelope, raw: list[str], rows: list[dict], *, seed: int = 0) -> list[str]:
    ctx = EnvelopeContext.for_file(name, seed=seed)
    return [envelope.line(r, row, i, ctx) for i, (r, row) in enumerate(zip(raw, rows))]


def run(envelopes: dict, systems, directory: str) -> dict:
    results: dict = {}
    cpu = {"ours": 0.0, "drain3": 0.0}
    lines_total = 0
    for name in systems:
        raw, rows = load_system(name)
        truth = [r["EventId"] for r in rows]
        for env in envelopes.values():
            if env.systems is not None and name not in env.systems:
                continue
            lines = enveloped(name, env, raw, rows)
            path = Path(directory) / f"{name}.{env.name}.log"
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            t = time.process_time()
            ours = list(parse_templates([str(path)]).lines)
            cpu["ours"] += time.process_time() - t
            t = time.process_time()
            theirs = drain3_groups(lines)
            cpu["drain3"] += time.process_time() - t
            lines_total += len(lines)
            results.setdefault(name, {})[env.name] = {"ours": grouping_accuracy(truth, ours),
                                                      "drain3": grouping_accuracy(truth, theirs)}
    return {"results": results, "cpu_s": cpu, "lines": lines_total}


def table(report: dict, envelopes: dict) -> str:
    results = report["results"]
    names = [n for n in envelopes if any(n in per for per in results.values())]
    out = ["| system | " + " | ".join(f"{n} ours / drain3" for n in names) + " |",
           "| --- |" + " ---: |" * len(names)]
    for system, per in results.items():
        cells = [f"{per[n]['ours']:.3f} / {per[n]['drain3']:.3f}" if n in per else "-" for n in names]
        out.append(f"| {system} | " + " | ".join(cells) + " |")
    means, worst = [], []
    for n in names:
        vals = [per[n] for per in results.values() if n in per]
        means.append(f"**{sum(v['ours'] for v in vals) / len(vals):.3f}** / {sum(v['drain3'] for v in vals) / len(vals):.3f}")
        gaps = [(per[n]["ours"] - per[n]["drain3"], s) for s, per in results.items() if n in per]
        gap, system = min(gaps)
        worst.append(f"{gap:+.3f} ({system})")
    out.append("| **mean** | " + " | ".join(means) + " |")
    out.append("| worst ours - drain3 | " + " | ".join(worst) + " |")
    cpu = report["cpu_s"]
    out.append(f"\nCPU seconds over {report['lines']:,} lines: ours {cpu['ours']:.1f}, drain3 {cpu['drain3']:.1f} "
               f"(drain3 / ours = {cpu['drain3'] / cpu['ours']:.2f}x)")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--held-out", action="store_true", help="the held-out envelopes instead of the development ones")
    ap.add_argument("--envelopes", help="comma-separated envelope names (default: all of the set)")
    ap.add_argument("--systems", help="comma-separated loghub systems (default: all 15)")
    ap.add_argument("--json", metavar="FILE", help="write the numbers as JSON")
    args = ap.parse_args(argv)
    if args.held_out:
        from ucp.tools.bench.logs_envelopes_heldout import HELD_OUT as envelopes
    else:
        envelopes = DEVELOPMENT
    if args.envelopes:
        envelopes = {n: envelopes[n] for n in args.envelopes.split(",")}
    systems = args.systems.split(",") if args.systems else SYSTEMS
    with tempfile.TemporaryDirectory() as directory:
        report = run(envelopes, systems, directory)
    print(table(report, envelopes))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
