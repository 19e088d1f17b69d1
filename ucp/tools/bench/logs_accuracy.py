"""Accuracy of `ucp logs analyze` on a labeled benchmark log.

The benchmark log is the loghub samples (real HPC, Thunderbird, Linux and
OpenStack lines, labeled normal) interleaved with injected faults of known
category and time (ucp/tools/bench/logs_faults.py) and injected normal GPU-cluster
traffic. Loghub lines that are themselves failures (labeled by template in
ucp/tools/bench/logs_labels.json, independently of the taxonomy) are reported
apart and left out of the false-positive rate. Prints precision/recall/F1 per injected
category, recall on held-out wordings, and the share of normal lines flagged.

Run:  .venv/bin/python ucp/tools/bench/logs_accuracy.py [--per-kind 40] [--seed 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from ucp.reliability.logs.analyze import AnalysisOptions, analyze_logs  # noqa: E402
from ucp.reliability.logs.taxonomy import load_taxonomy  # noqa: E402
from ucp.tools.bench.logs_faults import FAULTS, render_fault, render_normal  # noqa: E402
from ucp.tools.bench.logs_loso import loghub_system  # noqa: E402

def build_benchmark(*, per_kind: int, normals: int, seed: int):
    """Lines plus, per line, (label, held_out); label 'normal' or 'loghub-failure' or a category."""
    rng = random.Random(seed)
    real = []
    for name in ("HPC", "Thunderbird", "Linux", "OpenStack"):
        path, failures = loghub_system(name)  # labeled by template in ucp/tools/bench/logs_labels.json
        for lineno, text in enumerate(Path(path).read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            real.append((text, "loghub-failure" if lineno in failures else "normal", False))
    t0 = 1_717_000_000.0
    injected = []
    for kind in FAULTS:
        for _ in range(per_kind):
            line, category = render_fault(rng, kind, ts=t0 + rng.uniform(0, 30 * 86400))
            injected.append((line, category, kind.held_out))
    for _ in range(normals):
        injected.append((render_normal(rng, ts=t0 + rng.uniform(0, 30 * 86400)), "normal", False))
    rng.shuffle(injected)
    # Interleave: injected lines at random positions among the real ones (real order kept).
    slots = sorted(rng.sample(range(len(real) + len(injected)), len(injected)))
    out, ri, ii = [], 0, 0
    slot_set = set(slots)
    for pos in range(len(real) + len(injected)):
        if pos in slot_set:
            out.append(injected[ii])
            ii += 1
        else:
            out.append(real[ri])
            ri += 1
    return out


def evaluate(rows, predicted: dict[int, str]) -> dict:
    injected = sorted({label for _, label, _ in rows if label not in ("normal", "loghub-failure")})
    tp, fp, fn = Counter(), Counter(), Counter()
    held = defaultdict(lambda: [0, 0])
    normal_total = normal_flagged = 0
    loghub_fail = loghub_flagged = 0
    for i, (_, label, held_out) in enumerate(rows, start=1):
        pred = predicted.get(i, "normal")
        if label == "loghub-failure":
            loghub_fail += 1
            loghub_flagged += pred != "normal"
            continue
        if label == "normal":
            normal_total += 1
            if pred != "normal":
                normal_flagged += 1
                fp[pred] += 1
            continue
        if held_out:
            held[label][0] += 1
            held[label][1] += pred == label
        if pred == label:
            tp[label] += 1
        else:
            fn[label] += 1
            if pred != "normal":
                fp[pred] += 1
    table = []
    for cat in injected:
        p = tp[cat] / (tp[cat] + fp[cat]) if tp[cat] + fp[cat] else 0.0
        r = tp[cat] / (tp[cat] + fn[cat]) if tp[cat] + fn[cat] else 0.0
        f1 = 2 * p * r / (p + r) if p + r else 0.0
        table.append({"category": cat, "support": tp[cat] + fn[cat], "precision": p, "recall": r, "f1": f1,
                      "held_out_recall": (held[cat][1] / held[cat][0]) if held[cat][0] else None})
    all_tp, all_fp, all_fn = sum(tp.values()), sum(fp[c] for c in injected), sum(fn.values())
    micro_p = all_tp / (all_tp + all_fp) if all_tp + all_fp else 0.0
    micro_r = all_tp / (all_tp + all_fn) if all_tp + all_fn else 0.0
    held_n = sum(v[0] for v in held.values())
    return {
        "per_category": table,
        "micro_f1": 2 * micro_p * micro_r / (micro_p + micro_r) if micro_p + micro_r else 0.0,
        "macro_f1": sum(t["f1"] for t in table) / len(table),
        "held_out_recall": sum(v[1] for v in held.values()) / held_n if held_n else None,
        "normal_lines": normal_total, "normal_flagged": normal_flagged,
        "normal_flagged_rate": normal_flagged / normal_total if normal_total else 0.0,
        "loghub_failure_lines": loghub_fail, "loghub_failure_flagged": loghub_flagged,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-kind", type=int, default=40, help="injected lines per fault variant")
    ap.add_argument("--normals", type=int, default=3000, help="injected normal GPU-cluster lines")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--model-only", action="store_true",
                    help="ablation: drop the taxonomy's regex rules, classify with the trained model alone")
    args = ap.parse_args(argv)
    rows = build_benchmark(per_kind=args.per_kind, normals=args.normals, seed=args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "benchmark.log")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(text for text, _, _ in rows) + "\n")
        taxonomy = load_taxonomy()
        if args.model_only:
            taxonomy = dataclasses.replace(taxonomy, rules=(), template_rules=())
        result = analyze_logs([path], taxonomy=taxonomy, options=AnalysisOptions(default_year=2024))
    predicted = {e.line: e.category for e in result.events}
    report = evaluate(rows, predicted)
    print(f"{len(rows)} lines: {sum(1 for r in rows if r[1] not in ('normal', 'loghub-failure'))} injected faults "
          f"({len(FAULTS)} variants, {sum(k.held_out for k in FAULTS)} held out), "
          f"{report['normal_lines']} normal lines\n")
    print("| category | support | precision | recall | F1 | held-out recall |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for t in report["per_category"]:
        h = "-" if t["held_out_recall"] is None else f"{t['held_out_recall']:.2f}"
        print(f"| {t['category']} | {t['support']} | {t['precision']:.3f} | {t['recall']:.3f} | {t['f1']:.3f} | {h} |")
    print(f"\nmicro F1 {report['micro_f1']:.3f}, macro F1 {report['macro_f1']:.3f}, "
          f"held-out recall {report['held_out_recall']:.3f}")
    print(f"normal lines flagged: {report['normal_flagged']} / {report['normal_lines']} "
          f"= {100 * report['normal_flagged_rate']:.2f}%")
    print(f"classification methods (per new masked line): {result.classification_methods}")
    print(f"real loghub failure lines (hand-labeled, not scored): {report['loghub_failure_flagged']} / "
          f"{report['loghub_failure_lines']} flagged")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
