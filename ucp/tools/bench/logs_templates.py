"""Grouping accuracy of `ucp logs templates` against plain drain3, per loghub system, in one run.

Grouping accuracy (Zhu et al., ICSE-SEIP 2019): a line counts as correct when
the set of lines its parser gave its template equals the set of lines of its
ground-truth template (../shared/data/loghub/structured/<System>_2k.log_structured.csv).

Ours reads the *raw* log files (it finds the envelope and header itself).
drain3 runs with its default settings twice: on the raw lines, and on the
ground-truth ``Content`` column (the header already removed by loghub's
per-system format strings: a generous baseline). One configuration for all
systems on our side; no per-system settings anywhere.

Run:  .venv/bin/python ucp/tools/bench/logs_templates.py [--json out.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from drain3 import TemplateMiner  # noqa: E402
from drain3.template_miner_config import TemplateMinerConfig  # noqa: E402

from ucp.reliability.logs.templates import parse_templates  # noqa: E402

LOGHUB = ROOT / ".." / "shared" / "data" / "loghub"
SYSTEMS = ("Android", "Apache", "HDFS", "HPC", "Hadoop", "HealthApp", "Linux", "Mac", "OpenSSH", "OpenStack",
           "Proxifier", "Spark", "Thunderbird", "Windows", "Zookeeper")


def grouping_accuracy(truth: list, predicted: list) -> float:
    """Share of lines whose predicted group is exactly their ground-truth group."""
    assert len(truth) == len(predicted), (len(truth), len(predicted))
    by_truth, by_pred = defaultdict(set), defaultdict(set)
    for i, (t, p) in enumerate(zip(truth, predicted)):
        by_truth[t].add(i)
        by_pred[p].add(i)
    return sum(by_truth[t] == by_pred[p] for t, p in zip(truth, predicted)) / len(truth)


def drain3_groups(lines: list[str]) -> list[int]:
    """drain3 with its default configuration; each line's cluster after all lines were seen."""
    miner = TemplateMiner(config=TemplateMinerConfig())
    for line in lines:
        miner.add_log_message(line)
    groups = []
    for line in lines:
        cluster = miner.match(line)  # None when the line's cluster grew past it: ask drain3 again
        groups.append(cluster.cluster_id if cluster is not None else miner.add_log_message(line)["cluster_id"])
    return groups


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="FILE", help="write the per-system numbers as JSON")
    args = ap.parse_args(argv)
    rows = {}
    print("| system | lines | templates (truth) | ours | drain3 on raw lines | drain3 on truth content | "
          "ours / drain3 (content) | ours templates | ours s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in SYSTEMS:
        with open(LOGHUB / "structured" / f"{name}_2k.log_structured.csv", encoding="utf-8") as handle:
            truth_rows = list(csv.DictReader(handle))
        truth = [r["EventId"] for r in truth_rows]
        raw = (LOGHUB / f"{name}_2k.log").read_text(encoding="utf-8", errors="replace").splitlines()
        t = time.perf_counter()
        report = parse_templates([str(LOGHUB / f"{name}_2k.log")])
        seconds = time.perf_counter() - t
        ours = grouping_accuracy(truth, list(report.lines))
        d_raw = grouping_accuracy(truth, drain3_groups(raw))
        d_content = grouping_accuracy(truth, drain3_groups([r["Content"] for r in truth_rows]))
        rows[name] = {"lines": len(truth), "truth_templates": len(set(truth)), "ours": ours, "drain3_raw": d_raw,
                      "drain3_content": d_content, "ours_templates": len(set(report.lines)), "seconds": seconds}
        print(f"| {name} | {len(truth):,} | {len(set(truth))} | {ours:.3f} | {d_raw:.3f} | {d_content:.3f} | "
              f"{ours / d_content if d_content else float('inf'):.2f}x | {len(set(report.lines))} | {seconds:.2f} |")
    mean = {k: sum(r[k] for r in rows.values()) / len(rows) for k in ("ours", "drain3_raw", "drain3_content")}
    below = [n for n, r in rows.items() if r["ours"] < r["drain3_content"]]
    print(f"| **average** | | | **{mean['ours']:.3f}** | {mean['drain3_raw']:.3f} | {mean['drain3_content']:.3f} | "
          f"{mean['ours'] / mean['drain3_content']:.2f}x | | |")
    print(f"\nsystems where ours is below drain3 (on truth content): {', '.join(below) or 'none'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"systems": rows, "mean": mean}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
